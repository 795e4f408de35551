"""``openrft serve-model`` started on a free 127.0.0.1 port for a test, and stopped after it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_model(model: str, log: Path, *options: str) -> Iterator[str]:
    """The server's base URL (``http://127.0.0.1:PORT``) once ``/health`` answers; its output goes to ``log``."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "openrft"), "serve-model", model]
    command += ["--host", "127.0.0.1", "--port", str(port), "--threads", "1", *options]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"serve-model exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            pytest.fail(f"serve-model did not start within 180 s: {log.read_text()[-2000:]}")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
