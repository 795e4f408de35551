"""The official ``openai`` package, pointed at the server, drives a reinforcement job end to end."""

from __future__ import annotations

import time

import openai
import pytest

from tests.service.svc_helpers import TRAIN, VALIDATION, small_dataset

pytestmark = pytest.mark.slow
GRADER = {
    "type": "string_check",
    "name": "correct",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "eq",
}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_openai_client_runs_a_reinforcement_job(service, tmp_path):
    service.serve(workers=1)
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-anything-works-locally", max_retries=0)

    with small_dataset(tmp_path / "train.jsonl", TRAIN, 16).open("rb") as f:
        train = client.files.create(file=f, purpose="fine-tune")
    with small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4).open("rb") as f:
        validation = client.files.create(file=f, purpose="fine-tune")
    assert train.purpose == "fine-tune" and train.bytes == (tmp_path / "train.jsonl").stat().st_size
    assert {f.id for f in client.files.list()} >= {train.id, validation.id}

    job = client.fine_tuning.jobs.create(
        model="openrft-demo",
        training_file=train.id,
        validation_file=validation.id,
        suffix="demo",
        seed=3,
        metadata={"team": "ci"},
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADER,
                "hyperparameters": {
                    "n_epochs": 1,
                    "batch_size": 4,
                    "compute_multiplier": 0.25,
                    "eval_interval": 1,
                    "eval_samples": 1,
                },
            },
        },
        extra_body={"openrft": {"max_new_tokens": 6, "eval_max_examples": 4, "tensorboard": False, "threads": 1}},
    )
    assert job.status == "queued" and job.training_file == train.id and job.metadata == {"team": "ci"}
    assert job.method.type == "reinforcement" and job.method.reinforcement.grader.name == "correct"

    deadline = time.monotonic() + 180
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model == f"ft:openrft-demo:openrft:demo:{job.id}" and job.seed == 3

    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    metrics = [e for e in events if e.type == "metrics"]
    assert sorted(e.data["step"] for e in metrics) == [0, 1, 2, 3, 4]  # 16 prompts / 4 per step, one epoch
    assert {"step", "total_steps", "scores", "errors", "timing"} <= set(metrics[0].data)
    page = client.fine_tuning.jobs.list_events(job.id, limit=2)
    assert len(page.data) == 2 and page.has_more

    checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
    assert 1 <= len(checkpoints) <= 3
    rewards = [c.metrics.model_extra["valid_reward_mean"] for c in checkpoints]
    assert rewards == sorted(rewards, reverse=True)
    assert all(c.fine_tuning_job_id == job.id for c in checkpoints)

    assert [j.id for j in client.fine_tuning.jobs.list(limit=5)] == [job.id]
    with pytest.raises(openai.ConflictError):
        client.fine_tuning.jobs.cancel(job.id)
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.retrieve("ftjob-missing")
    with pytest.raises(openai.BadRequestError) as bad:
        client.fine_tuning.jobs.create(
            model="openrft-demo",
            training_file="file-nope",
            method={"type": "reinforcement", "reinforcement": {"grader": GRADER}},
        )
    assert bad.value.body["param"] == "training_file"

    result = client.fine_tuning.alpha.graders.run(grader=GRADER, model_sample="42", item={"reference_answer": "42"})
    assert result.reward == 1.0
    assert client.fine_tuning.alpha.graders.validate(grader=GRADER).grader.name == "correct"
    assert client.files.delete(train.id).deleted
