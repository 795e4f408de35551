"""Real servers on 127.0.0.1 for the monitoring tests: started as processes, waited for with a bound."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server_process(argv: list[str], url: str, log: Path, timeout_s: float, env: dict | None = None) -> Iterator[str]:
    """Start ``argv``, wait until ``url`` answers (any HTTP status) within ``timeout_s``, yield ``url``,
    then stop the process group."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                httpx.get(url, timeout=2.0)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    tail = log.read_text()[-3000:]
                    raise TimeoutError(f"{url} did not answer within {timeout_s}s:\n{tail}") from None
                time.sleep(0.25)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def moto_server(log: Path) -> contextmanager:
    port = free_port()
    return server_process(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        f"http://127.0.0.1:{port}",
        log,
        timeout_s=60,
    )


def mlflow_server(root: Path, log: Path) -> contextmanager:
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    root.mkdir(parents=True, exist_ok=True)
    argv = [
        str(mlflow),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{root / 'server.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
    ]
    # the server's background job runner (prompt optimisation and such) is not needed: it only slows the start
    return server_process(
        argv, f"http://127.0.0.1:{port}", log, timeout_s=120, env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    )
