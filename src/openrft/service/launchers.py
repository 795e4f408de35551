"""How a worker starts a job's process.

- ``SpawnLauncher``: ``python -m openrft.service.job_process JOB_ID ...``, a fresh interpreter
  (``openrft worker --spawn``).
- ``ForkLauncher``: the standalone ``openrft worker`` imports the engine once and forks a child per
  job, which then runs the same ``job_process.main``; a job starts in well under a second instead of
  paying the torch/transformers import (seconds of CPU) every time. The parent never touches torch's
  thread pools or CUDA, so the child starts clean; it drops the inherited database pool unclosed.
- ``ForkServerLauncher``: the embedded worker of ``openrft serve``, a threaded server that must not fork
  itself: a fork server (``multiprocessing``'s, a fresh single-threaded interpreter started with the
  server) imports the engine once, while the server starts, and forks each job from there, so a job
  starts as fast as under ``ForkLauncher``.

Either way each job runs in a process of its own, in a new session, writing to its log file.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing import forkserver
from pathlib import Path
from typing import Protocol

from openrft.service.config import ServiceConfig


class JobHandle(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...

    def wait(self, timeout: float) -> int: ...


def job_args(job_id: str, attempt: int, config: ServiceConfig) -> list[str]:
    return [
        job_id,
        "--attempt",
        str(attempt),
        "--database-url",
        config.database_url,
        "--data-dir",
        str(config.data_dir),
    ]


class SpawnLauncher:
    def __init__(self, config: ServiceConfig):
        self.config = config

    def start(self, job_id: str, attempt: int, log_path: Path) -> JobHandle:
        with log_path.open("ab") as log:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "openrft.service.job_process",
                    *job_args(job_id, attempt, self.config),
                    "--parent-pid",
                    str(os.getpid()),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )


class _ForkedJob:
    """A ``multiprocessing`` child behind the ``subprocess.Popen`` methods the worker uses."""

    def __init__(self, process: multiprocessing.Process):
        self.process = process
        self.pid = process.pid or 0

    def poll(self) -> int | None:
        return None if self.process.is_alive() else self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def terminate(self) -> None:
        self.process.terminate()

    def wait(self, timeout: float) -> int:
        self.process.join(timeout)
        if self.process.is_alive():
            raise subprocess.TimeoutExpired("job process", timeout)
        return self.process.exitcode or 0


def _forked_main(args: list[str], log_path: str, inherited_engine=None) -> None:
    """A forked job process: its own session, default signals, output to its log, then ``job_process.main``;
    it exits when the process it was forked from (the worker, or the server's fork server) is gone."""
    parent = os.getppid()
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT):  # the worker's handlers would only set its (copied) stop flag
        signal.signal(sig, signal.SIG_DFL)
    if inherited_engine is not None:
        inherited_engine.dispose(close=False)  # the parent's connections stay the parent's
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    from openrft.service import job_process

    sys.exit(job_process.main([*args, "--parent-pid", str(parent)]))


class ForkLauncher:
    def __init__(self, config: ServiceConfig, engine):
        import openrft.service.job_process  # noqa: F401  (the engine, torch, transformers: once, here)

        self.config = config
        self.engine = engine
        self.context = multiprocessing.get_context("fork")

    def start(self, job_id: str, attempt: int, log_path: Path) -> JobHandle:
        sys.stdout.flush()
        sys.stderr.flush()
        process = self.context.Process(
            target=_forked_main,
            name=f"openrft-job-{job_id}",
            daemon=False,
            args=(job_args(job_id, attempt, self.config), str(log_path), self.engine),
        )
        process.start()
        return _ForkedJob(process)


def _from_fork_server(args: list[str], log_path: str) -> None:
    """A job forked by the fork server. The fork server runs while any process holds the write end of its
    "alive" pipe, and hands each child a copy: closed here, the fork server exits with the server that
    started it, and this job, its parent gone, exits too (``job_process.watch_parent``)."""
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None
    _forked_main(args, log_path)


class ForkServerLauncher:
    """Jobs forked from a fork server that imported the engine once; started (in the background) at once."""

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["openrft.service.job_process"])
        forkserver.ensure_running()  # returns at once; the fork server imports the engine meanwhile

    def start(self, job_id: str, attempt: int, log_path: Path) -> JobHandle:
        process = self.context.Process(
            target=_from_fork_server,
            name=f"openrft-job-{job_id}",
            daemon=False,
            args=(job_args(job_id, attempt, self.config), str(log_path)),
        )
        process.start()  # waits for the fork server to have imported the engine (the first job only)
        return _ForkedJob(process)
