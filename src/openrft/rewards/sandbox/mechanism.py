"""How a sandboxed worker is started: the bubblewrap command line (strict) or a plain one (weak).

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
- whole-sandbox limits where the host offers cgroups (``cgroups.py``): memory (processes and tmpfs
  files together, ``memory_limit_mb``) and processes (``max_processes``);
- resource limits set by the worker before any user code runs: address space per process
  (``memory_limit_mb``), written file size, no core files; the pool kills the whole sandbox (its
  PID namespace) when a call passes its time limit, and a worker whose answer is larger than
  ``output_limit_mb``.

Weak isolation: the same worker as a plain subprocess, as the same user, with the resource limits,
an empty environment and the scratch directory as working directory. It does not block network or
file access; every outcome is flagged ``sandbox_weak``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import site
import subprocess
import sys
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
    from openrft.rewards.sandbox import cgroups

    gaps = []
    reason = strict_unavailable()
    if reason:
        gaps.append(f"user code cannot run in the strict sandbox: {reason}")
    why = cgroups.unavailable()
    if why:
        gaps.append(
            f"no usable cgroups ({why}): each sandboxed process has its own address-space limit, but the "
            "memory of a sandbox's processes together and the number of its processes are not limited"
        )
    return gaps
