"""``generator_base_url`` with the default ``sync`` strategy: each step samples from the server (with the
learner's current adapter), never silently from the learner's own model (``openrft serve-model`` here;
tests/vllm does the same against vLLM)."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml

from openrft.engine.job import RFTJob
from openrft.rollout.remote import GenerationServerError
from openrft.spec.dialects import load_job
from tests.conftest import small_recipe
from tests.server.serve_model import free_port, serve_model


def _spec(tmp_path, url):
    path = small_recipe(tmp_path, max_steps=2)
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"]["generator_base_url"] = url
    path.write_text(yaml.safe_dump(recipe))
    spec = load_job(path)
    assert spec.rollout.strategy == "sync" and spec.rollout.generation_engine == "server"
    return spec


def test_a_sync_job_samples_from_the_server(tmp_path):
    log = tmp_path / "server.log"
    with serve_model("openrft-demo", log, "--allow-load-from", str(tmp_path)) as url:
        summary = RFTJob(_spec(tmp_path, url), tmp_path / "run", show_progress=False).run()
        served = {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]}
    assert summary["status"] == "succeeded"
    assert "test-run-r0-v1" in served  # step 2 sampled with the adapter of the policy after step 1
    assert "test-run-r0-v0" not in served  # step 1's, unloaded
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "actor/pg_loss" in m]
    assert len(steps) == 2
    for m in steps:  # the server's sampler and the learner: the same model in fp32
        assert m["rollout_correction/ratio_mean"] == pytest.approx(1.0, abs=1e-3)


def test_a_sync_job_whose_server_is_down_fails_naming_the_step_and_the_server(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GenerationServerError, match=rf"step 1: cannot reach the generation server at {url}"):
        RFTJob(_spec(tmp_path, url), tmp_path / "run", show_progress=False).run()


def test_the_colocated_engine_without_vllm_is_refused_by_name(tmp_path):
    """``rollout.engine: vllm`` in a Python without vLLM (the project's .venv): the job stops naming the engine
    and both ways out, never falls back to the learner's own sampler (tests/vllm runs it where vLLM is)."""
    from openrft.errors import OpenRFTError

    path = small_recipe(tmp_path, max_steps=1)
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"]["generation_engine"] = "vllm"
    path.write_text(yaml.safe_dump(recipe))
    spec = load_job(path)
    assert spec.rollout.generation_engine == "vllm"
    with pytest.raises(OpenRFTError, match=r"rollout.engine 'vllm' needs vLLM importable in the job's Python") as e:
        RFTJob(spec, tmp_path / "run", show_progress=False).run()
    assert "VLLM_WITH_OPENRFT=1" in str(e.value) and "rollout.generator_base_url" in str(e.value)
    assert (
        not (tmp_path / "run" / "metrics.jsonl").exists()
        or "actor/pg_loss" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    )
