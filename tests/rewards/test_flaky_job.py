"""A real short RFT job whose Nova-lambda reward server drops calls, answers slowly and returns
malformed bodies: the job completes, every failure is counted under its kind, none is scored 0."""

import json

import pytest

from openrft.engine.job import RFTJob
from openrft.errors import RewardError
from openrft.spec.job import JobSpec
from tests.rewards.helpers import FAST_REMOTE, reward_server

pytestmark = pytest.mark.slow


def write_jsonl(path, ids):
    with path.open("w") as f:
        for i, example_id in enumerate(ids):
            f.write(
                json.dumps(
                    {
                        "id": example_id,
                        "messages": [{"role": "user", "content": f"What is {i}+{i}?"}],
                        "reference_answer": str(2 * i),
                    }
                )
                + "\n"
            )


def job_spec(tmp_path, endpoint, train_ids, steps=2):
    write_jsonl(tmp_path / "train.jsonl", train_ids)
    write_jsonl(tmp_path / "val.jsonl", ["ok-v1", "ok-v2"])
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "openrft-demo"},
            "data": {
                "train": str(tmp_path / "train.jsonl"),
                "validation": str(tmp_path / "val.jsonl"),
                "shuffle": False,
            },
            "sampling": {"samples_per_prompt": 2, "max_new_tokens": 6, "max_length": 128},
            "training": {"prompts_per_step": len(train_ids), "total_steps": steps},
            "evaluation": {"at_start": False},
            "tracking": {"tensorboard": False},
            "runtime": {"threads": 1},
            "reward": {
                "function": {"type": "nova_lambda", "endpoint": endpoint, "batch_size": 1, "concurrency_limit": 8},
                "remote": {**FAST_REMOTE, "circuit_failures": 50},
            },
        }
    )


def test_flaky_reward_server_job_completes_and_counts_every_failure(tmp_path):
    faults = [
        "--fault",
        "drop=drop",
        "--fault",
        "slow=slow",
        "--fault",
        "bad=malformed",
        "--slow-seconds",
        "2",
        "--flaky-rate",
        "0.5",
        "--constant",
        "0.75",
    ]
    with reward_server(*faults) as url:
        spec = job_spec(tmp_path, url, ["ok-a", "slow-a", "drop-a", "bad-a"])
        summary = RFTJob(spec, tmp_path / "run", show_progress=False).run()
    assert summary["status"] == "succeeded"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward/errors" in r]
    assert [r["step"] for r in train] == [1, 2]
    for row in train:  # per step: 4 prompts x 2 samples; only ok-a's two are scored
        assert row["reward/samples"] == 8
        assert row["reward/errors/timeout"] == 2
        assert row["reward/errors/server_error"] == 2
        assert row["reward/errors/invalid_output"] == 2
        assert row["reward/errors/parse_error"] == 0 and row["reward/errors/runtime_error"] == 0
        assert row["reward/errors"] == 6 and row["reward/excluded"] == 6
        assert row["reward/scored"] == 2
        # a failed sample scored as 0 would pull min below the server's constant 0.75
        assert row["critic/rewards/min"] == row["critic/rewards/mean"] == 0.75
        assert row["train_p95_reward_latency"] >= row["train_mean_reward_latency"] > 0
    assert rows[-1]["val-score/errors"] == 0


def test_a_reward_endpoint_that_is_down_fails_the_job(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = job_spec(tmp_path, f"http://127.0.0.1:{port}/", ["ok-a", "ok-b"], steps=1)
    spec.reward.remote.circuit_failures = 2
    with pytest.raises(RewardError, match=rf"127.0.0.1:{port}/ is down: 2 calls in a row failed"):
        RFTJob(spec, tmp_path / "run", show_progress=False).run()
