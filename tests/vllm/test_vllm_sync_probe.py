"""The sync probe against a real vLLM server (``make test-vllm``): vLLM's ``prompt_logprobs`` agree with the learner's
at the same weights (the fp32 tolerance measured here); in real jobs a correct sync passes, and each planted fault is
caught naming the replica: the sync skipped (the old adapter kept), one LoRA name reused without unloading (vLLM
keeps the adapter it cached under that name), full weights scaled by 1.01."""

from __future__ import annotations

import json
import re

import pytest
import torch

from openrft.engine import RFTJob
from openrft.engine.setup import build_parts
from openrft.engine.sync_check import SyncProbeError
from openrft.rollout.sync_probe import TOLERANCES, max_abs_diff, probe_from_prompts, score_with_model
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec
from tests.conftest import FUZZY_REWARD
from tests.engine.test_sync_probe import PlantedRuntime
from tests.server.test_sync_probe_server import ReusedNameRuntime
from tests.vllm.conftest import vllm_recipe
from tests.vllm.test_vllm_engine import _generator, _spec, _trained_learner


def _job_spec(tmp_path, url, steps=2, full_rank=False):
    spec = load_job(vllm_recipe(tmp_path, url, max_steps=steps, save_steps=100))
    spec.evaluation.at_start = False
    spec.reward = RewardSpec.model_validate(FUZZY_REWARD)  # rewards that differ, so every step moves the policy
    if full_rank:
        spec.lora = spec.lora.model_copy(update={"enabled": False})
        spec.optimizer = spec.optimizer.model_copy(update={"learning_rate": 1e-4})
    return spec


def _caught(job) -> tuple[str, int, float]:
    with pytest.raises(SyncProbeError) as caught:
        job.run()
    match = re.search(r"replica (\S+) serves policy version (\d+) .* by (\S+) on the sync probe", str(caught.value))
    assert match, str(caught.value)
    return match.group(1), int(match.group(2)), float(match.group(3))


def test_prompt_logprobs_match_the_learner_at_the_same_weights(vllm_server, tmp_path):
    spec = _spec(tmp_path, vllm_server)
    learner = _trained_learner(spec)
    generator = _generator(vllm_server, spec, tmp_path, "probe")
    from openrft.engine.setup import build_parts

    probe = probe_from_prompts(build_parts(_job_spec(tmp_path, vllm_server)).train_prompts, count=4)
    with learner.policy.model.disable_adapter():  # the base model (the server serves no adapter yet)
        learner_base = score_with_model(learner.policy.model, probe)
    base = max_abs_diff(generator.score(probe), learner_base)
    try:
        generator.load_adapter(learner.policy.adapter_state(), 1)
        adapted = max_abs_diff(generator.score(probe), score_with_model(learner.policy.model, probe))
    finally:
        generator._post("/unload_lora_adapter", {"lora_name": "probe-v1"})
    print(f"vLLM-CPU fp32 vs learner fp32: base {base:.3g}, with the adapter {adapted:.3g}")
    assert base <= TOLERANCES[("vllm", "float32")] and adapted <= TOLERANCES[("vllm", "float32")]


def test_a_correct_sync_passes(vllm_server, tmp_path):
    RFTJob(_job_spec(tmp_path, vllm_server), tmp_path / "run", show_progress=False).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/time_per_step" in r]
    assert len(rows) == 2
    diffs = [r["sync/max_logprob_diff/replica_0"] for r in rows]
    assert all(d <= TOLERANCES[("vllm", "float32")] for d in diffs), diffs


def test_a_skipped_sync_is_caught(vllm_server, tmp_path):
    spec = _job_spec(tmp_path, vllm_server)
    job = RFTJob(spec, tmp_path / "run", show_progress=False, runtime=PlantedRuntime("skip"))
    replica, version, diff = _caught(job)
    assert (replica, version) == ("remote-0", 1) and diff > TOLERANCES[("server", "unknown")]


def test_a_reused_lora_name_is_caught(vllm_server, tmp_path):
    job = RFTJob(_job_spec(tmp_path, vllm_server), tmp_path / "run", show_progress=False, runtime=ReusedNameRuntime())
    try:
        replica, version, diff = _caught(job)
    finally:
        import httpx

        httpx.post(f"{vllm_server}/v1/unload_lora_adapter", json={"lora_name": "test-run-r0-live"}, timeout=30)
    assert (replica, version) == ("remote-0", 1) and diff > TOLERANCES[("server", "unknown")]


def test_full_weights_scaled_by_1_01_are_caught(vllm_server, tmp_path):
    spec = _job_spec(tmp_path, vllm_server, full_rank=True)
    job = RFTJob(spec, tmp_path / "run", show_progress=False, runtime=PlantedRuntime("scale"))
    try:
        replica, version, diff = _caught(job)
    finally:  # the shared server serves the demo model again
        from transformers import AutoModelForCausalLM

        from openrft.models import resolve_model_path

        model = AutoModelForCausalLM.from_pretrained(resolve_model_path("openrft-demo"), torch_dtype=torch.float32)
        _generator(vllm_server, spec, tmp_path, "restore").load_adapter(model.state_dict(), 99)
    assert (replica, version) == ("remote-0", 1) and diff > TOLERANCES[("server", "unknown")]


def test_full_weights_take_the_file_path_with_the_reason_logged(vllm_server, tmp_path, caplog):
    """vLLM 0.32 in development mode has the weight-transfer routes, but its backends need CUDA: the files are
    chosen and the reason logged (rollout/weight_transfer.py)."""
    import logging

    from transformers import AutoModelForCausalLM

    from openrft.models import resolve_model_path

    spec = _spec(tmp_path, vllm_server, enabled=False)
    generator = _generator(vllm_server, spec, tmp_path, "choice")
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("openrft-demo"), torch_dtype=torch.float32)
    with caplog.at_level(logging.INFO, logger="openrft.rollout"):
        generator.load_adapter(model.state_dict(), 1)  # the demo model's own weights: the server is unchanged
    assert generator.full_weights_path == "files"
    assert generator.full_weights_reason.startswith("the server has the weight-transfer routes, but vLLM's")
    assert "CUDA" in generator.full_weights_reason
    assert any("full weights reach" in r.getMessage() for r in caplog.records)


def test_an_adapter_reloaded_in_place_serves_its_new_weights(vllm_server, tmp_path):
    """A name the server already holds (a job run again against a server that kept running) is reloaded in place: the
    server must then score with the new weights, not its cached prompt KV of the old ones."""
    spec = _spec(tmp_path, vllm_server)
    learner = _trained_learner(spec)
    probe = probe_from_prompts(build_parts(_job_spec(tmp_path, vllm_server)).train_prompts, count=4)
    first = _generator(vllm_server, spec, tmp_path / "a", "inplace")
    again = _generator(vllm_server, spec, tmp_path / "b", "inplace")  # a fresh client: the name is the server's
    try:
        first.load_adapter(learner.policy.adapter_state(), 1)
        old = first.score(probe)
        with torch.no_grad():
            for p in learner.policy.trainable_parameters():
                p.mul_(-1.5)
        again.load_adapter(learner.policy.adapter_state(), 1)  # "already been loaded": in place
        new = again.score(probe)
    finally:
        again._post("/unload_lora_adapter", {"lora_name": "inplace-v1"})
    assert max_abs_diff(old, score_with_model(learner.policy.model, probe)) > 0.1  # the weights did change
    assert max_abs_diff(new, score_with_model(learner.policy.model, probe)) <= TOLERANCES[("vllm", "float32")]
