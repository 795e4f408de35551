"""The job python-genai's own test sends (``test_tune_reinforcement``: Gemini 2.5 Flash, a gs:// dataset and an
autorater reward with only ``autoraterModel``), as the SDK writes its REST body, validates and trains here
with the documented mappings (``--map-model``, ``--map URI=PATH``) and a judge on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

from openrft.engine import RFTJob
from openrft.spec.dialects import resolve_job
from tests.rewards.chat_server import ChatServer

ROOT = Path(__file__).resolve().parents[2]
GCS = "gs://cloud-samples-data/ai-platform/generative_ai/gemini-1_5/text/sft_train_data.jsonl"
SDK_BODY = {  # google.genai.tunings' REST body for the test's CreateTuningJobConfig
    "baseModel": "gemini-2.5-flash",
    "tunedModelDisplayName": "Model display name",
    "reinforcementTuningSpec": {
        "trainingDatasetUri": GCS,
        "hyperParameters": {
            "epochCount": 1,
            "adapterSize": "ADAPTER_SIZE_ONE",
            "learningRateMultiplier": 1.0,
            "batchSize": 4,
            "samplesPerPrompt": 4,
            "evaluateInterval": 100,
            "checkpointInterval": 100,
            "maxOutputTokens": 2048,
        },
        "singleRewardConfig": {"autoraterScorer": {"autoraterConfig": {"autoraterModel": "test-model"}}},
    },
}


class FixedJudge:
    def reply(self, messages: list[dict], max_tokens: int) -> str:
        return "1"


def test_the_sdks_reinforcement_job_validates_and_trains_with_the_mappings(tmp_path, monkeypatch):
    lines = (ROOT / "examples" / "arithmetic" / "vertex_train.jsonl").read_text().splitlines()[:8]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    job = tmp_path / "job.json"
    job.write_text(json.dumps(SDK_BODY))
    r = resolve_job(
        job,
        mappings={"model_map": {"gemini-2.5-flash": "openrft-demo"}},
        replacements={GCS: str(tmp_path / "train.jsonl")},
    )
    assert r.spec.model.name_or_path == "openrft-demo" and r.spec.lora.rank == 1
    assert r.spec.training.prompts_per_step == 4 and r.spec.training.total_steps == 1  # 8 lines, 4 held out
    assert any(w.path.endswith("autoraterPrompt") for w in r.warnings)
    with ChatServer(FixedJudge()) as judge:
        monkeypatch.setenv("OPENRFT_JUDGE_BASE_URL", judge.base_url)
        summary = RFTJob(r.spec, tmp_path / "run", show_progress=False).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(row.get("critic/rewards/mean") == 1.0 for row in rows)
    assert {req["body"]["model"] for req in judge.requests} == {"test-model"}
