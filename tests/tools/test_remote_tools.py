"""Tool episodes sampled from a generation server (``generator_base_url``: ``openrft serve-model``, the vLLM
subset of the API): each turn is a token-id completion request, tools run in the job's process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from openrft.engine import RFTJob
from openrft.spec.dialects import load_job
from tests.tools.test_train_tools import EXAMPLE, rows, tools_recipe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tool_model_server(tmp_path):
    port = _free_port()
    log = tmp_path / "server.log"
    command = [
        str(Path(sys.executable).parent / "openrft"),
        "serve-model",
        str(EXAMPLE / "model"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        "1",
    ]
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
        yield f"{url}/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
def test_tool_episodes_through_a_generation_server(tmp_path, tool_model_server):
    recipe = tools_recipe(tmp_path, "off_policy_async", generator_base_url=tool_model_server)
    spec = load_job(recipe)
    summary = RFTJob(spec, tmp_path / "run", show_progress=False).run()
    assert summary["status"] == "succeeded"
    steps = rows(tmp_path / "run")[1:]
    called = [r for r in steps if r["tools/calls/total"] > 0]
    assert called and all(r["tools/failed_episodes"] == 0.0 for r in steps)
    assert called[0]["tools/masked_tokens/total"] > 0 and called[0]["tools/turns/max"] >= 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 3
