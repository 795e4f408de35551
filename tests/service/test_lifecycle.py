"""Full job lifecycles against a real server process (API + embedded worker), on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import httpx
import pytest

from openrft.rewards.types import ERROR_KINDS
from tests.service.svc_helpers import TRAIN, VALIDATION, all_events, small_dataset, tiny_recipe, upload, wait_status

pytestmark = pytest.mark.slow
FINISHED = ("succeeded", "failed", "cancelled")


@pytest.fixture
def client(service):
    service.serve(workers=1)
    with httpx.Client(base_url=service.base_url, timeout=30) as c:
        yield c


@pytest.fixture
def datasets(client, tmp_path) -> tuple[str, str]:
    train = upload(client, small_dataset(tmp_path / "train.jsonl", TRAIN, 16))
    validation = upload(client, small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4))
    return train, validation


def submit(client, datasets, **kwargs) -> dict:
    response = client.post("/v1/nova/jobs", json=tiny_recipe(*datasets, **kwargs))
    assert response.status_code == 200, response.text
    return response.json()


def metric_steps(client, job_id) -> list[int]:
    return [e["data"]["step"] for e in all_events(client, job_id) if e["type"] == "metrics"]


def test_job_runs_to_success_with_events_metrics_and_checkpoints(client, datasets, service):
    job = submit(client, datasets, steps=3)
    assert job["status"] == "queued" and job["training_file"] == datasets[0]
    done = wait_status(client, job["id"], FINISHED)
    assert done["status"] == "succeeded", done
    assert done["fine_tuned_model"] == f"ft:openrft-demo:openrft::{job['id']}"
    assert done["trained_tokens"] > 0 and done["step"] == 3 and done["finished_at"] >= done["created_at"]

    events = all_events(client, job["id"])
    messages = [e["message"] for e in events]
    assert messages[0].startswith("Created fine-tuning job") and messages[-1] == "The job has successfully completed"
    assert sum(m.startswith("Job started") for m in messages) == 1
    metrics_events = [e for e in events if e["type"] == "metrics"]
    assert [e["data"]["step"] for e in metrics_events] == [0, 1, 2, 3]
    data = metrics_events[2]["data"]
    assert data["total_steps"] == 3
    assert 0.0 <= data["scores"]["train_reward_mean"] <= 1.0
    assert data["scores"]["valid_reward_mean"] == data["metrics"]["val-score/rewards/mean@1"]
    assert set(data["errors"]) == set(ERROR_KINDS) and all(v == 0 for v in data["errors"].values())
    assert data["timing"]["step"]["full_iteration"] == data["metrics"]["perf/time_per_step"]
    assert all("/tmp" not in m and str(service.data_dir) not in m for m in messages)  # no server paths

    rows = client.get(f"/v1/fine_tuning/jobs/{job['id']}/metrics").json()["data"]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    # best three by validation reward (later step first among equals), each with its step's scores
    expected = sorted((-r["val-score/rewards/mean@1"], -r["step"]) for r in rows[1:])[:3]
    checkpoints = client.get(f"/v1/fine_tuning/jobs/{job['id']}/checkpoints").json()["data"]
    assert [c["step_number"] for c in checkpoints] == [-step for _, step in expected]
    for c in checkpoints:
        assert c["object"] == "fine_tuning.job.checkpoint" and c["fine_tuning_job_id"] == job["id"]
        assert c["metrics"]["valid_reward_mean"] == rows[c["step_number"]]["val-score/rewards/mean@1"]
        assert c["fine_tuned_model_checkpoint"].endswith(f":ckpt-step-{c['step_number']}")

    result = client.get(f"/v1/files/{done['result_files'][0]}/content")
    assert result.status_code == 200 and len(result.text.splitlines()) == 4
    assert (service.data_dir / "runs" / job["id"] / "adapter" / "adapter_config.json").exists()


def test_pause_checkpoints_and_resume_continues(client, datasets, service):
    job = submit(client, datasets, steps=10, save_steps=5)
    deadline = time.monotonic() + 120
    while client.get(f"/v1/fine_tuning/jobs/{job['id']}").json()["step"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    paused = client.post(f"/v1/fine_tuning/jobs/{job['id']}/pause").json()
    assert paused["status"] in ("pausing", "paused")
    paused = wait_status(client, job["id"], ("paused", *FINISHED))
    assert paused["status"] == "paused", paused
    step = paused["step"]
    assert 1 <= step < 10
    assert (service.data_dir / "runs" / job["id"] / "checkpoints" / f"step-{step:06d}").is_dir()
    assert client.post(f"/v1/fine_tuning/jobs/{job['id']}/pause").status_code == 409

    assert client.post(f"/v1/fine_tuning/jobs/{job['id']}/resume").json()["status"] == "queued"
    done = wait_status(client, job["id"], FINISHED)
    assert done["status"] == "succeeded", done
    messages = [e["message"] for e in all_events(client, job["id"])]
    assert f"Resuming from the checkpoint at step {step}" in messages
    assert metric_steps(client, job["id"]) == list(range(11))


def test_cancel_stops_a_running_job_within_seconds_and_a_queued_one_at_once(client, datasets):
    running = submit(client, datasets, steps=500, save_steps=100)
    queued = submit(client, datasets, steps=2)
    wait_status(client, running["id"], ("running",))
    cancelled = client.post(f"/v1/fine_tuning/jobs/{queued['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"  # never started
    deadline = time.monotonic() + 120
    while client.get(f"/v1/fine_tuning/jobs/{running['id']}").json()["step"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    asked = time.monotonic()
    client.post(f"/v1/fine_tuning/jobs/{running['id']}/cancel")
    done = wait_status(client, running["id"], FINISHED, timeout=30)
    assert done["status"] == "cancelled" and time.monotonic() - asked < 10
    assert client.post(f"/v1/fine_tuning/jobs/{running['id']}/cancel").status_code == 409
    assert wait_status(client, queued["id"], FINISHED)["status"] == "cancelled"
