"""How a worker starts a job's process.

- ``SpawnLauncher``: ``python -m openrft.service.job_process JOB_ID ...``, a fresh interpreter (the
  embedded worker of ``openrft serve`` uses it: a threaded server must not fork).
- ``ForkLauncher``: the standalone ``openrft worker`` imports the engine once and forks a child per
  job, which then runs the same ``job_process.main``; a job starts in well under a second instead of
  paying the torch/transformers import (seconds of CPU) every time. The parent never touches torch's
  thread pools or CUDA, so the child starts clean; it drops the inherited database pool unclosed.

Either way each job runs in a process of its own, in a new session, writing to its log file.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from openrft.service.config import ServiceConfig


class JobHandle(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...

    def wait(self, timeout: float) -> int: ...


def job_args(
    job_id: str, attempt: int, config: ServiceConfig, placement_group: str | None = None, devices: str | None = None
) -> list[str]:
    """The job process's arguments: the operator's settings it needs travel here (the store holds only the job),
    and what admission reserved for it: a placement group on the server's cluster, or this machine's GPUs."""
    cluster = ["--ray-address", config.ray_address] if config.ray_address else []
    if placement_group:
        cluster += ["--placement-group", placement_group]
    if devices is not None:
        cluster += [f"--gpus={devices}"]
    if config.allow_private_urls:  # a tenant's job then calls private addresses, as its submission allowed
        cluster += ["--allow-private-urls"]
    if config.agent_base_url:  # its agent's base_url (docs/agents.md)
        cluster += ["--agent-base-url", config.agent_base_url]
    return [
        job_id,
        "--attempt",
        str(attempt),
        "--database-url",
        config.database_url,
        "--data-dir",
        str(config.data_dir),
        "--parent-pid",
        str(os.getpid()),
        *cluster,
    ]


class SpawnLauncher:
    def __init__(self, config: ServiceConfig):
        self.config = config

    def start(
        self, job_id: str, attempt: int, log_path: Path, placement_group: str | None = None, devices: str | None = None
    ) -> JobHandle:
        args = job_args(job_id, attempt, self.config, placement_group, devices)
        with log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "openrft.service.job_process", *args],
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


def _forked_main(args: list[str], log_path: str, inherited_engine) -> None:
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT):  # the worker's handlers would only set its (copied) stop flag
        signal.signal(sig, signal.SIG_DFL)
    inherited_engine.dispose(close=False)  # the parent's connections stay the parent's
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    from openrft.service import job_process

    sys.exit(job_process.main(args))


class ForkLauncher:
    def __init__(self, config: ServiceConfig, engine):
        import openrft.service.job_process  # noqa: F401  (the engine, torch, transformers: once, here)

        self.config = config
        self.engine = engine
        self.context = multiprocessing.get_context("fork")

    def start(
        self, job_id: str, attempt: int, log_path: Path, placement_group: str | None = None, devices: str | None = None
    ) -> JobHandle:
        sys.stdout.flush()
        sys.stderr.flush()
        process = self.context.Process(
            target=_forked_main,
            name=f"openrft-job-{job_id}",
            daemon=False,
            args=(job_args(job_id, attempt, self.config, placement_group, devices), str(log_path), self.engine),
        )
        process.start()
        return _ForkedJob(process)
