"""Tests against a real vLLM server (``make test-vllm``: scripts/test_vllm.sh starts it and sets
OPENRFT_VLLM_URL). A missing server fails these tests, never skips them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, small_recipe


def vllm_url() -> str:
    url = os.environ.get("OPENRFT_VLLM_URL")
    if not url:
        raise RuntimeError("OPENRFT_VLLM_URL is not set: run these tests with `make test-vllm`")
    return url


@pytest.fixture(scope="session")
def vllm_server() -> str:
    url = vllm_url()
    httpx.get(f"{url}/health", timeout=10).raise_for_status()
    return url


class ServerProcess:
    """A vLLM server of a test's own (scripts/vllm_server.sh with its own state directory)."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.env = {**os.environ, "VLLM_STATE_DIR": str(state_dir)}
        self.url: str | None = None

    def start(self, port: int | None = None) -> str:
        args = ["bash", str(ROOT / "scripts" / "vllm_server.sh"), "start", *([str(port)] if port else [])]
        out = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=400, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"the vLLM server did not start: {out.stderr[-2000:]}")
        self.url = out.stdout.strip().splitlines()[-1]
        return self.url

    @property
    def pid(self) -> int:
        return int((self.state_dir / "pid").read_text())

    def stop(self) -> None:
        subprocess.run(["bash", str(ROOT / "scripts" / "vllm_server.sh"), "stop"], env=self.env, timeout=60, cwd=ROOT)


@pytest.fixture
def shared_server_process(vllm_server) -> ServerProcess:
    """The session's server as a process to kill and restart (its state directory: VLLM_STATE_DIR, set by
    scripts/test_vllm.sh, which stops whatever server the pid file names at the end)."""
    state = os.environ.get("VLLM_STATE_DIR")
    if not state:
        raise RuntimeError("VLLM_STATE_DIR is not set: run these tests with `make test-vllm`")
    server = ServerProcess(ROOT / state)
    server.url = vllm_server
    return server


def vllm_recipe(tmp_path: Path, url: str, strategy: str = "sync", **trainer) -> Path:
    """The tests' small demo recipe, generating through the vLLM server at ``url``."""
    path = small_recipe(tmp_path, **trainer)
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"]["generator_base_url"] = url
    strategy_block = {"type": strategy, **({"age_tolerance": 1} if strategy == "off_policy_async" else {})}
    recipe["training_config"]["rollout"]["rollout_strategy"] = strategy_block
    path.write_text(yaml.safe_dump(recipe))
    return path
