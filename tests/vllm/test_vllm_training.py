"""The demo recipe trained through a real vLLM server: sync and off_policy_async rollouts, the rollout
correction's mismatch metrics, and a server killed mid-run (the step fails naming it; the job resumes)."""

from __future__ import annotations

import json
import os
import signal
import uuid

import httpx
import pytest

from openrft.engine.job import JobControl, RFTJob
from openrft.rollout.remote import GenerationServerError
from openrft.spec.dialects import load_job
from tests.vllm.conftest import vllm_recipe


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _served(url) -> set[str]:
    return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}


@pytest.mark.parametrize("strategy", ["sync", "off_policy_async"])
def test_the_demo_recipe_trains_through_vllm(vllm_server, tmp_path, strategy):
    spec = load_job(vllm_recipe(tmp_path, vllm_server, strategy, max_steps=4))
    spec.name = f"vllm-{strategy.replace('_', '-')}-{uuid.uuid4().hex[:8]}"  # adapter names of this run only
    assert spec.rollout.generation_engine == "server" and spec.rollout.correction_mode == "tis"
    summary = RFTJob(spec, tmp_path / "run", show_progress=False).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 4
    steps = [m for m in _metrics(tmp_path / "run") if m.get("step", 0) > 0 and "actor/pg_loss" in m]
    assert len(steps) == 4
    for m in steps:  # vLLM and the learner agree closely at the same weights: ratios ~1, tiny KL
        if strategy == "sync" or m["rollout/policy_age/max"] == 0:
            assert m["rollout_correction/ratio_mean"] == pytest.approx(1.0, abs=0.01)
            assert 0 <= m["rollout_correction/kl"] < 1e-3
            assert m["rollout_correction/missing_logprobs"] == 0
    # the policy of the last generation is served under its versioned name, earlier ones unloaded
    served = {name for name in _served(vllm_server) if name.startswith(spec.name)}
    assert len(served) == 1
    assert int(next(iter(served)).rsplit("-v", 1)[1]) >= (3 if strategy == "sync" else 2)
    for name in served:
        httpx.post(f"{vllm_server}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)


class KillServerAt(JobControl):
    """Kills the vLLM server (its whole process group) before a given step."""

    def __init__(self, step: int, pid: int):
        self.step, self.pid = step, pid

    def poll(self, step: int):
        if step == self.step:
            os.killpg(self.pid, signal.SIGKILL)
        return "continue"


def test_a_killed_server_fails_the_step_by_name_and_the_job_resumes(shared_server_process, tmp_path):
    """The session's server is killed (this test runs last) and restarted at the same address."""
    server = shared_server_process
    url = server.url
    spec = load_job(vllm_recipe(tmp_path, url, "sync", max_steps=3))
    spec.name = f"vllm-killed-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    with pytest.raises(GenerationServerError) as failure:
        RFTJob(spec, run_dir, show_progress=False, control=KillServerAt(2, server.pid)).run()
    assert "step 2" in str(failure.value) and url in str(failure.value)
    assert (run_dir / "checkpoints").exists()
    server.start(int(url.rsplit(":", 1)[1]))  # the same address: the run's spec names it
    summary = RFTJob.from_run_dir(run_dir, show_progress=False).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 3
    steps = [m["step"] for m in _metrics(run_dir) if "actor/pg_loss" in m]
    assert steps == [1, 2, 3]
