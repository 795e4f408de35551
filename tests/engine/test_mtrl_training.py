"""Nova MTRL recipes train: a 2-step demo job with each of the recipe's loss_fn values (the registry's
losses), pass@k validation metrics in metrics.jsonl; data_filter leaves a planted degenerate sample out of
the update and counts it; the pass@k estimator against hand-computed values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from openrft.data.records import Example
from openrft.engine import RFTJob
from openrft.engine.evaluation import EvalResult, pass_at_k
from openrft.engine.rollouts import RolloutGroup
from openrft.engine.train_batch import build_train_batch, repeated_run
from openrft.rewards.types import RewardOutcome
from openrft.rollout.types import Completion
from openrft.spec.dialects import load_job
from openrft.spec.job import EvalSpec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "arithmetic"
LAMBDA = ROOT / "tests" / "published" / "rewards" / "metric_keyed_lambda.py"
ARN = "arn:aws:lambda:us-east-1:123456789012:function:demo-reward"


def mtrl_recipe(tmp_path: Path, loss_fn: str, **sections) -> Path:
    recipe = {
        "display_name": "demo MTRL",
        "recipe_version": "1.0.25",
        "run": {
            "name": f"mtrl-{loss_fn}",
            "model_type": "mtrl",
            "data_s3_path": str(DEMO / "train.jsonl"),
            "validation_data_s3_path": str(DEMO / "validation.jsonl"),
            "reward_lambda_arn": ARN,
        },
        "batch": {"training_batch_size": 8, "group_size": 2, "val_batch_size": 8, "val_group_size": 4},
        "rl": {"loss_fn": loss_fn},
        "sampling_params": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 512},
        "val_sampling_params": {"temperature": 1.0},
        "val_metrics_config": {"pass_k_values": [1, 2, 4, 8], "success_threshold": 1.0},
        "schedule": {"epochs": 1, "max_steps": 2, "save_every": 0, "val_every": 0, "val_at_start": True},
        "model": {"model_name": "openrft-demo", "max_sequence_length": 64, "lora_rank": 16, "learning_rate": 2e-3},
        "async_config": {"max_steps_off_policy": 0},
        "data_filter": {"max_filter_rate": 0.5, "max_repeated_tokens": 30, "max_ngram_size": 30},
        "openrft": {"tensorboard": False, "threads": 1, "lambda_map": {ARN: f"{LAMBDA}:lambda_handler"}},
        **sections,
    }
    path = tmp_path / "mtrl.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.mark.parametrize(("loss_fn", "off_policy"), [("importance_sampling", 0), ("ppo", 0), ("cispo", 0), ("ppo", 3)])
def test_an_mtrl_recipe_trains_two_steps_with_each_loss_fn(loss_fn, off_policy, tmp_path):
    spec = load_job(mtrl_recipe(tmp_path, loss_fn, async_config={"max_steps_off_policy": off_policy}))
    assert spec.algorithm.loss_fn == loss_fn and spec.training.total_steps == 2
    assert spec.rollout.strategy == ("off_policy_async" if off_policy else "sync")
    run_dir = tmp_path / "run"
    summary = RFTJob(spec, run_dir, show_progress=False).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "actor/pg_loss" in r]
    assert len(trained) == 2
    assert all(math.isfinite(r["actor/pg_loss"]) and "data_filter/filtered" in r for r in trained)
    validated = [r for r in rows if "val-score/pass@1" in r]
    assert validated and validated[0]["step"] == 0  # val_at_start, and again after the last step
    for row in validated:
        assert 0 <= row["val-score/pass@1"] <= row["val-score/pass@2"] <= row["val-score/pass@4"] <= 1
        assert "val-score/pass@8" not in row  # 4 samples of a prompt: pass@8 cannot be estimated


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3): one draw of 3 misses both successes
    assert pass_at_k(5, 3, 3) == 1.0  # any 3 of 5 hold one of the 3 successes


def outcome(score):
    return RewardOutcome(score=score)


def completion(tokens):
    return Completion(
        prompt_ids=[1], token_ids=tokens, logprobs=[0.0] * len(tokens), text="", finish_reason="stop", policy_version=0
    )


def test_eval_pass_at_k_over_prompts_with_the_success_threshold():
    failed = RewardOutcome(None, error_kind="timeout")
    groups = [
        RolloutGroup(Example(id="a", messages=[]), [1], [], [outcome(1.0), outcome(0.0), outcome(0.6), outcome(0.0)]),
        RolloutGroup(Example(id="b", messages=[]), [1], [], [outcome(0.0)] * 3 + [failed]),
    ]
    result = EvalResult(0.0, 0.0, 0, 8, 0.0, rollouts=groups)
    metrics = result.metrics(4, EvalSpec(pass_k=[1, 2, 8], success_threshold=0.5))
    assert metrics["val-score/pass@1"] == pytest.approx((2 / 4 + 0) / 2)
    assert metrics["val-score/pass@2"] == pytest.approx((1 - 1 / 6 + 0) / 2)  # prompt a: 2 of 4 succeed
    assert "val-score/pass@8" not in metrics


def test_data_filter_leaves_a_planted_degenerate_sample_out_and_counts_it(tmp_path):
    spec = load_job(
        mtrl_recipe(
            tmp_path, "ppo", data_filter={"max_filter_rate": 0.5, "max_repeated_tokens": 10, "max_ngram_size": 4}
        )
    )
    looping = [7, 8, 9] * 6  # a 3-gram said 6 times: a repeated stretch of 15 tokens
    assert repeated_run(looping, 4) == 15 and repeated_run(looping, 2) == 0
    scored = [outcome(1.0), outcome(0.0)]
    groups = [
        RolloutGroup(Example(id="a", messages=[]), [1], [completion([5, 6]), completion(looping)], scored),
        RolloutGroup(Example(id="b", messages=[]), [1], [completion([4, 3]), completion([2, 9])], scored),
    ]
    samples, metrics, advantages = build_train_batch(groups, spec, learner_version=0)
    assert metrics["data_filter/degenerate"] == 1 and metrics["data_filter/filtered"] == 1
    assert looping not in [s.response_ids for s in samples] and len(samples) == 3
    # prompt a keeps one valid sample: no group advantage left; the filtered sample is out of the update (NaN)
    assert advantages[0][0] == 0 and math.isnan(advantages[0][1])
    capped = spec.model_copy(deep=True)
    capped.algorithm.data_filter.max_filter_rate = 0.1  # 0.1 × 4 samples: none may be filtered
    _, metrics, _ = build_train_batch(groups, capped, learner_version=0)
    assert metrics["data_filter/degenerate"] == 1 and metrics["data_filter/filtered"] == 0
