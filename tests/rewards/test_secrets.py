"""No secret of the host reaches user code: its environment is empty, and the /proc it sees holds only the
sandbox's own processes (bubblewrap, PID 1 inside, is started with an empty environment too)."""

import asyncio
import json

import pytest

from openrft.calls.sandbox import SandboxPool
from openrft.cli import main
from openrft.spec.rewards import SandboxSpec
from tests.rewards.helpers import SECRET_PROBE, SECRETS, require_bwrap


@pytest.fixture
def secrets_set(monkeypatch):
    require_bwrap()
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def test_sandboxed_code_reads_no_secret_from_its_environment_or_proc(secrets_set):
    async def go():
        pool = SandboxPool(SandboxSpec(workers=1, memory_limit_mb=512))
        try:
            return await pool.call(SECRET_PROBE, "leaks", [], 10)
        finally:
            await pool.aclose()

    result = asyncio.run(go())
    assert result.ok, result.message
    found, pids = result.value
    assert found == []
    assert 1 <= pids <= 3  # bwrap (PID 1) and the worker: no process of the host is visible


def test_rewards_test_runs_a_grader_that_finds_no_secret(secrets_set, tmp_path, capsys):
    grader = {"type": "python", "name": "probe", "source": SECRET_PROBE}
    (tmp_path / "grader.json").write_text(json.dumps(grader))
    (tmp_path / "example.json").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    args = ["rewards", "test", str(tmp_path / "grader.json"), "--example", str(tmp_path / "example.json")]
    assert main([*args, "--response", "x", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["error_kind"] is None, out
    assert out["score"] == 0.25  # 1.0 would mean the grader read a secret
