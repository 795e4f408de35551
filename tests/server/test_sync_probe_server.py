"""The sync probe against a real ``openrft serve-model`` on 127.0.0.1: the server's ``prompt_logprobs`` (vLLM's
field) agree with the learner's at the same weights; a correct sync passes with its metric every step; a client
that reuses one LoRA name without unloading it (the server keeps the first adapter: vLLM caches by name, ours
refuses the name) fails the job naming the replica, the version and the difference. tests/vllm does the same
against vLLM."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml

from openrft.engine.job import RFTJob
from openrft.engine.local_runtime import LocalRuntime
from openrft.engine.sync_check import SyncProbeError
from openrft.rollout.remote import GenerationServerError, RemoteGenerator, write_peft_adapter
from openrft.rollout.sync_probe import TOLERANCES, ProbeSet, score_with_model
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec
from tests.conftest import FUZZY_REWARD, small_recipe
from tests.server.serve_model import serve_model


class ReusedNameGenerator(RemoteGenerator):
    """The planted fault: every version loaded under one name, never unloaded, the server's refusal ignored."""

    def load_adapter(self, weights, version: int) -> None:
        name = f"{self.adapter_prefix}-live"
        path = write_peft_adapter(weights, self.lora, self.base_model, self.adapter_dir / f"v{version}")
        try:
            self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path.resolve())})
        except GenerationServerError as exc:
            if "already been loaded" not in str(exc):
                raise
        self._adapter, self._version = name, version


class ReusedNameRuntime(LocalRuntime):
    def generation_replicas(self, spec, parts, learner, run_dir):
        replicas = super().generation_replicas(spec, parts, learner, run_dir)
        for replica in replicas:
            replica.generator.__class__ = ReusedNameGenerator
            replica.scorer = replica.generator
        return replicas


def _spec(tmp_path: Path, url: str, steps: int = 2):
    path = small_recipe(tmp_path, max_steps=steps)
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"]["generator_base_url"] = url
    path.write_text(yaml.safe_dump(recipe))
    spec = load_job(path)
    spec.reward = RewardSpec.model_validate(FUZZY_REWARD)  # rewards that differ, so every step moves the policy
    return spec


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_prompt_logprobs_of_the_server_match_the_model_and_a_correct_sync_passes(tmp_path):
    from openrft.engine.setup import build_parts

    with serve_model("openrft-demo", tmp_path / "server.log", "--allow-load-from", str(tmp_path)) as url:
        parts = build_parts(_spec(tmp_path, url))
        prompt, continuation = parts.train_prompts[0], parts.train_prompts[1][:6]
        body = {"prompt": [prompt + continuation], "max_tokens": 1, "prompt_logprobs": 2}
        choice = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
        entries = choice["prompt_logprobs"]
        assert entries[0] is None and len(entries) == len(prompt) + len(continuation)
        assert all(str(t) in e and len(e) <= 3 for t, e in zip((prompt + continuation)[1:], entries[1:]))
        expected = score_with_model(parts.model, ProbeSet([prompt], [continuation]))[0]
        served = [e[str(t)]["logprob"] for t, e in zip(continuation, entries[len(prompt) :])]
        assert served == pytest.approx(expected, abs=1e-4)

        RFTJob(_spec(tmp_path, url), tmp_path / "run", show_progress=False).run()
    rows = [r for r in _rows(tmp_path / "run") if "perf/time_per_step" in r]
    assert len(rows) == 2
    for row in rows:  # the same model in fp32 on both sides: far below even the fp32 tolerance
        assert row["sync/max_logprob_diff/replica_0"] == row["sync/max_logprob_diff"] < 1e-3


def test_a_reused_lora_name_is_caught(tmp_path):
    events = []
    with serve_model("openrft-demo", tmp_path / "server.log", "--allow-load-from", str(tmp_path)) as url:
        job = RFTJob(
            _spec(tmp_path, url, steps=3),
            tmp_path / "run",
            show_progress=False,
            runtime=ReusedNameRuntime(),
            on_event=lambda level, message: events.append((level, message)),
        )
        with pytest.raises(SyncProbeError) as caught:
            job.run()
    match = re.search(r"replica (\S+) serves policy version (\d+) .* by (\S+) on the sync probe", str(caught.value))
    assert match and match.group(1) == "remote-0" and match.group(2) == "1", str(caught.value)
    assert float(match.group(3)) > TOLERANCES[("server", "unknown")]
    assert any("loading the weights again" in m for _, m in events)
