"""Limits for a whole sandbox through control groups: memory (the RAM of all its processes and of its tmpfs
files, together) and the number of processes.

A worker's process joins its own control group before it execs bubblewrap, so every process the user
code starts is inside. cgroup v2 is used when this process's cgroup delegates the ``memory`` and
``pids`` controllers; otherwise the v1 ``memory`` and ``pids`` hierarchies when they are writable
(a root service). Where neither is usable, ``unavailable()`` says why and the sandbox falls back to
per-process limits (``RLIMIT_AS``) and tmpfs sizes: ``openrft serve`` logs what is not enforced.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "openrft-sandbox"
_counter = itertools.count()


def _own_path(controller: str | None) -> str | None:
    """This process's cgroup path for a v1 ``controller``, or the v2 path (controller None)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller is None and controllers == "" and line.startswith("0::"):
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return None


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, type, options) of every cgroup mount."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], parts[3]))
    return out


@dataclass(frozen=True)
class Layout:
    """Where the sandboxes' cgroups are made: one parent directory per hierarchy used."""

    version: str  # "v2" or "v1"
    memory_parent: Path
    pids_parent: Path


def _v2_layout() -> tuple[Layout | None, str]:
    mount = next((m for m, kind, _ in _mounts() if kind == "cgroup2"), None)
    own = _own_path(None)
    if mount is None or own is None:
        return None, "no cgroup v2 hierarchy is mounted"
    parent = Path(mount) / own.lstrip("/")
    try:
        controllers = (parent / "cgroup.controllers").read_text().split()
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return None, f"cgroup v2 at {parent} is not readable ({exc.strerror})"
    missing = [c for c in ("memory", "pids") if c not in controllers]
    if missing:
        return None, f"cgroup v2 at {parent} does not delegate the {' and '.join(missing)} controller(s)"
    if not all(c in enabled for c in ("memory", "pids")):
        try:
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
        except OSError as exc:
            return None, f"cannot enable memory and pids for child cgroups of {parent} ({exc.strerror})"
    return Layout("v2", parent, parent), ""


def _v1_layout() -> tuple[Layout | None, str]:
    mounts = {opt: mount for mount, kind, opts in _mounts() if kind == "cgroup" for opt in opts.split(",")}
    if "memory" not in mounts or "pids" not in mounts:
        return None, "no cgroup v1 memory and pids hierarchies are mounted"
    parents = []
    for controller in ("memory", "pids"):
        own = _own_path(controller) or "/"
        parents.append(Path(mounts[controller]) / own.lstrip("/"))
    return Layout("v1", parents[0], parents[1]), ""


class Cgroup:
    """One sandbox's control group (a directory per hierarchy), made with its limits set."""

    def __init__(self, layout: Layout, memory_bytes: int, max_processes: int):
        self.layout = layout
        name = f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.memory = layout.memory_parent / name
        self.pids = layout.pids_parent / name
        self.memory_bytes = memory_bytes
        self.max_processes = max_processes
        for path in {self.memory, self.pids}:
            path.mkdir()
        try:
            if layout.version == "v2":
                (self.memory / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (self.memory / "memory.swap.max").write_text("0")
                (self.pids / "pids.max").write_text(str(max_processes))
            else:
                (self.memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (self.memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (self.pids / "pids.max").write_text(str(max_processes))
        except BaseException:
            self.remove()
            raise

    def enter(self) -> None:
        """Move the calling process in (run in the child between fork and exec)."""
        pid = str(os.getpid())
        for path in {self.memory, self.pids}:
            with open(path / "cgroup.procs", "w") as f:
                f.write(pid)

    def memory_hit(self) -> bool:
        """Whether the sandbox ran into its memory limit (an allocation refused or a process killed)."""
        try:
            if self.layout.version == "v2":
                events = _keyed((self.memory / "memory.events").read_text())
                return events.get("max", 0) > 0 or events.get("oom_kill", 0) > 0
            return int((self.memory / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def pids_hit(self) -> bool:
        """Whether a fork was refused for the process limit."""
        try:
            return _keyed((self.pids / "pids.events").read_text()).get("max", 0) > 0
        except (OSError, ValueError):
            return False

    def remove(self) -> None:
        """Remove the directories (once their processes are gone; retried briefly while they exit)."""
        for path in {self.memory, self.pids}:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _keyed(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in text.splitlines() if line.strip())}


@functools.cache
def layout() -> tuple[Layout | None, str]:
    """The usable layout (v2 first, then v1), proven by making and removing a cgroup; else (None, why)."""
    reasons = []
    for find in (_v2_layout, _v1_layout):
        found, reason = find()
        if found is None:
            reasons.append(reason)
            continue
        try:
            Cgroup(found, 64 << 20, 8).remove()
        except OSError as exc:
            reasons.append(f"cannot make a {found.version} cgroup under {found.memory_parent} ({exc.strerror})")
            continue
        return found, ""
    return None, "; ".join(reasons)


def unavailable() -> str | None:
    """Why whole-sandbox memory and process limits cannot be enforced here, or None when they can."""
    return layout()[1] or None
