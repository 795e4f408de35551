"""How a sandboxed worker is started and confined: the bubblewrap command line (strict) or a plain one (weak),
and the control group that limits the whole sandbox.

Strict isolation, with bubblewrap (``bwrap``, Debian package ``bubblewrap``):

- new user, PID, network, IPC, UTS and cgroup namespaces (``--unshare-all``); the code runs as
  uid/gid 65534 (nobody) inside, with every capability dropped; it dies with its parent. bwrap is
  started with an empty environment: it is PID 1 of the sandbox, and its ``/proc/1/environ`` is
  readable from inside; the fresh ``/proc`` shows the sandbox's own processes only;
- no network: only the namespace's own loopback, so nothing outside is reachable, 127.0.0.1 of the
  host included;
- a filesystem of its own: ``/usr`` and the Python installation read-only, the environment's
  site-packages read-only under ``/sandbox/lib/N``, the worker script, fresh ``/proc`` and
  ``/dev``; ``/`` and ``/dev`` are read-only. The only writable places are a private scratch
  directory (``/scratch``, the working directory, ``HOME`` and ``TMPDIR``), a tmpfs of
  ``scratch_limit_mb``, and ``/dev/shm`` (16 MB). ``/etc``, ``/home``, ``/root`` (but for the
  Python installation's own directory when it lives there) and the project directory do not exist;
- whole-sandbox limits where the host offers cgroups (below): memory (processes and tmpfs
  files together, ``memory_limit_mb``) and processes (``max_processes``);
- resource limits set by the worker before any user code runs: address space per process
  (``memory_limit_mb``), written file size, no core files; the pool kills the whole sandbox (its
  PID namespace) when a call passes its time limit, and a worker whose answer is larger than
  ``output_limit_mb``.

Weak isolation: the same worker as a plain subprocess, as the same user, with the resource limits,
an empty environment and the scratch directory as working directory. It does not block network or
file access; every outcome is flagged ``sandbox_weak``.

Control groups: limits for a whole sandbox, not one process: memory (the RAM of all its processes and of
its tmpfs files, together) and the number of processes. A worker's process joins its own control group
before it execs bubblewrap, so every process the user code starts is inside. cgroup v2 is used when this
process's cgroup delegates the ``memory`` and ``pids`` controllers; otherwise the v1 ``memory`` and
``pids`` hierarchies when they are writable (a root service). Where neither is usable,
``cgroups_unavailable()`` says why and the sandbox falls back to per-process limits (``RLIMIT_AS``) and
tmpfs sizes: ``openrft serve`` logs what is not enforced.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).with_name("worker.py")
NOBODY = 65534
FILE_SIZE_LIMIT_MB = 256
SHM_SIZE_MB = 16


def python_executable() -> str:
    return os.path.realpath(sys.executable)


def import_paths(extra: list[str]) -> list[str]:
    """Site-packages of this environment plus the user's extra paths (existing directories only)."""
    paths = [*site.getsitepackages(), *extra]
    seen, out = set(), []
    for path in paths:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            out.append(real)
    return out


def worker_config(memory_limit_mb: int, paths: list[str]) -> str:
    return json.dumps({"memory_limit_mb": memory_limit_mb, "file_size_limit_mb": FILE_SIZE_LIMIT_MB, "paths": paths})


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _ro_system_dirs() -> list[str]:
    """``/usr`` and the merged-/usr symlinks (or real directories on older layouts)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def strict_command(scratch: str, memory_limit_mb: int, extra_paths: list[str], scratch_limit_mb: int = 64) -> list[str]:
    """The bubblewrap command line; ``scratch`` (a host directory) is unused since the scratch directory is a
    sized tmpfs (kept in the signature for callers)."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError("bwrap")
    python = python_executable()
    args = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--cap-drop",
        "ALL",
        *_ro_system_dirs(),
    ]
    prefixes = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(python))}
    for prefix in sorted(prefixes):
        if not prefix.startswith("/usr/") and prefix != "/usr":
            args += ["--ro-bind", prefix, prefix]
    inside_paths = []
    for i, path in enumerate(import_paths(extra_paths)):
        inside = f"/sandbox/lib/{i}"
        args += ["--ro-bind", path, inside]
        inside_paths.append(inside)
    args += [
        "--ro-bind",
        str(WORKER),
        "/sandbox/worker.py",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # the only writable places are RAM-backed and sized (and charged to the sandbox's cgroup where there is
        # one): the scratch directory and /dev/shm; / and /dev are read-only
        "--perms",
        "1777",
        "--size",
        str(SHM_SIZE_MB << 20),
        "--tmpfs",
        "/dev/shm",
        "--perms",
        "1777",
        "--size",
        str(scratch_limit_mb << 20),
        "--tmpfs",
        "/scratch",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        "/scratch",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/scratch",
        "--setenv",
        "TMPDIR",
        "/scratch",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--setenv",
        "LANG",
        "C.UTF-8",
        python,
        "-I",
        "-S",
        "/sandbox/worker.py",
        worker_config(memory_limit_mb, inside_paths),
    ]
    return args


def weak_command(scratch: str, memory_limit_mb: int, extra_paths: list[str]) -> list[str]:
    return [python_executable(), "-I", "-S", str(WORKER), worker_config(memory_limit_mb, import_paths(extra_paths))]


WEAK_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


WEAK_OPTION = (
    "set openrft.sandbox_isolation: weak (in a Nova recipe, a Vertex request or an OpenAI job; "
    "reward.sandbox.isolation: weak in an OpenRFT spec) to run user code without isolation"
)


@functools.cache
def strict_unavailable() -> str | None:
    """Why strict isolation cannot run here (None when it can): bwrap missing or refused."""
    if bwrap_path() is None:
        return (
            "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: apt-get install bubblewrap) or "
            f"{WEAK_OPTION}"
        )
    import tempfile

    with tempfile.TemporaryDirectory(prefix="openrft-sandbox-probe-") as scratch:
        command = strict_command(scratch, 512, [])
        command[-4:] = ["-I", "-S", "-c", "pass"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30, env={})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap could not start a sandbox: {exc}"
    if done.returncode != 0:
        return (
            f"bubblewrap could not start a sandbox here (exit {done.returncode}: {done.stderr.strip()[:300]}); "
            f"user namespaces may be disabled. Install bubblewrap where it can run, or {WEAK_OPTION}"
        )
    return None


def enforcement_gaps() -> list[str]:
    """What the sandbox cannot enforce on this host, in words for the service's startup log and docs."""
    gaps = []
    reason = strict_unavailable()
    if reason:
        gaps.append(f"user code cannot run in the strict sandbox: {reason}")
    why = cgroups_unavailable()
    if why:
        gaps.append(
            f"no usable cgroups ({why}): each sandboxed process has its own address-space limit, but the "
            "memory of a sandbox's processes together and the number of its processes are not limited"
        )
    return gaps


# ------------------------------------------------------------------------------------------------
# control groups

CGROUP_PREFIX = "openrft-sandbox"
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
class CgroupLayout:
    """Where the sandboxes' cgroups are made: one parent directory per hierarchy used."""

    version: str  # "v2" or "v1"
    memory_parent: Path
    pids_parent: Path


def _v2_layout() -> tuple[CgroupLayout | None, str]:
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
    return CgroupLayout("v2", parent, parent), ""


def _v1_layout() -> tuple[CgroupLayout | None, str]:
    mounts = {opt: mount for mount, kind, opts in _mounts() if kind == "cgroup" for opt in opts.split(",")}
    if "memory" not in mounts or "pids" not in mounts:
        return None, "no cgroup v1 memory and pids hierarchies are mounted"
    parents = []
    for controller in ("memory", "pids"):
        own = _own_path(controller) or "/"
        parents.append(Path(mounts[controller]) / own.lstrip("/"))
    return CgroupLayout("v1", parents[0], parents[1]), ""


class Cgroup:
    """One sandbox's control group (a directory per hierarchy), made with its limits set."""

    def __init__(self, layout: CgroupLayout, memory_bytes: int, max_processes: int):
        self.layout = layout
        name = f"{CGROUP_PREFIX}-{os.getpid()}-{next(_counter)}"
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
def cgroup_layout() -> tuple[CgroupLayout | None, str]:
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


def cgroups_unavailable() -> str | None:
    """Why whole-sandbox memory and process limits cannot be enforced here, or None when they can."""
    return cgroup_layout()[1] or None
