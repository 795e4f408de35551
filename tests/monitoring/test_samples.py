"""Samples recorded with a job: a few training prompts' answers per step and every validation answer per
evaluation, with rewards, graders, advantages and policy ages; kept under a size cap; a resumed run records
each step once; TensorBoard's text tab gets them."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

from openrft.algo.advantages import group_advantages
from openrft.engine import RFTJob, StopAfter
from openrft.engine.metrics import read_metrics
from openrft.engine.samples import SAMPLES_FILE, SampleLog, read_samples, segments
from openrft.spec.dialects import load_job
from tests.monitoring.conftest import recipe_with

SETTINGS = {"sample_prompts_per_step": 2, "eval_max_examples": 12}


def _spec(tmp_path, **openrft):
    return load_job(recipe_with(tmp_path, trainer={"max_steps": 3}, openrft={**SETTINGS, **openrft}))


def test_a_job_records_training_and_validation_samples(tmp_path):
    run_dir = tmp_path / "run"
    RFTJob(_spec(tmp_path, tensorboard=True), run_dir, show_progress=False).run()
    records = list(read_samples(run_dir))
    metrics = {row["step"]: row for row in read_metrics(run_dir / "metrics.jsonl")}

    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    # 2 of the 4 prompts of each step, 4 samples each
    assert sorted({r["step"] for r in train}) == [1, 2, 3]
    assert all(sum(r["step"] == s for r in train) == 2 * 4 for s in (1, 2, 3))
    for record in train:
        assert record["prompt"][-1]["role"] == "user" and isinstance(record["response"], str)
        assert record["policy_age"] == 0 and record["error_kind"] is None
        assert record["reward"] in (0.0, 1.0)
        assert record["graders"] == {"exact_match": {"score": record["reward"], "explanation": None}}

    # each recorded group's advantages are the group advantages of its recorded rewards
    groups = defaultdict(list)
    for record in train:
        groups[record["step"], record["prompt_index"]].append(record)
    for group in groups.values():
        rewards = torch.tensor([[r["reward"] for r in group]])
        expected = group_advantages(rewards, torch.ones_like(rewards, dtype=torch.bool), True, 1e-6)[0]
        assert [r["advantage"] for r in group] == pytest.approx(expected.tolist(), abs=1e-6)
        assert len({r["example_id"] for r in group}) == 1

    # every validation prompt at each evaluation, their mean the logged validation reward
    evaluated = [step for step, row in metrics.items() if "val-score/rewards/mean@1" in row]
    assert sorted({r["step"] for r in evals}) == evaluated == [0, 3]
    for step in evaluated:
        at_step = [r for r in evals if r["step"] == step]
        assert len(at_step) == 12 and len({r["example_id"] for r in at_step}) == 12
        mean = sum(r["reward"] for r in at_step) / len(at_step)
        assert mean == pytest.approx(metrics[step]["val-score/rewards/mean@1"])

    # TensorBoard's text tab holds a table of each recording
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    tags = events.Tags()["tensors"]
    assert "samples/train/text_summary" in tags and "samples/eval/text_summary" in tags
    texts = events.Tensors("samples/eval/text_summary")
    assert [t.step for t in texts] == [0, 3]
    assert "| example_id |" in texts[0].tensor_proto.string_val[0].decode()


def test_a_resumed_job_records_each_step_once_and_the_same_samples(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    RFTJob(_spec(tmp_path), straight, show_progress=False).run()
    RFTJob(_spec(tmp_path), resumed, show_progress=False, control=StopAfter(1)).run()
    RFTJob.from_run_dir(resumed, show_progress=False).run()
    assert list(read_samples(resumed)) == list(read_samples(straight))


def test_sample_settings_turn_recording_off(tmp_path):
    run_dir = tmp_path / "run"
    spec = _spec(tmp_path, sample_prompts_per_step=0, eval_samples=False)
    spec.training.total_steps = 1
    RFTJob(spec, run_dir, show_progress=False).run()
    assert list(read_samples(run_dir)) == []


def _record(step: int, size: int = 200) -> dict:
    return {"kind": "train", "step": step, "response": "x" * size}


def test_the_sample_log_stays_under_its_cap_dropping_the_oldest(tmp_path):
    log = SampleLog(tmp_path, max_bytes=10_000)  # segments of 2,500 bytes
    for step in range(1, 201):
        log.write([_record(step)])
        total = sum(p.stat().st_size for p in [*segments(tmp_path), tmp_path / SAMPLES_FILE] if p.exists())
        assert total <= 10_000 + 2_500 + 300  # the cap, the open segment, one record
    steps = [r["step"] for r in read_samples(tmp_path)]
    assert steps == list(range(steps[0], 201))  # the newest, in order, without gaps
    assert steps[0] > 100 and len(segments(tmp_path)) <= 4

    log.truncate_after(180)
    assert [r["step"] for r in read_samples(tmp_path)][-1] == 180
    log.write([_record(181)])
    assert [r["step"] for r in read_samples(tmp_path)][-2:] == [180, 181]


def test_long_texts_are_cut_saying_how_much(tmp_path):
    from openrft.engine.samples import TEXT_LIMIT, cut

    text = cut({"content": "y" * (TEXT_LIMIT + 10)})["content"]
    assert text.startswith("y" * TEXT_LIMIT) and text.endswith("(10 more characters)")
    assert json.loads(json.dumps(cut([1, "a", None]))) == [1, "a", None]
