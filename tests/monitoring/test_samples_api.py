"""Recorded samples outside the training loop: the job store (SQLite and PostgreSQL), the paged API route with
its filters and orders, tenants, the size cap, the dashboard's samples and comparison routes, ``openrft jobs
samples`` on a run directory and ``openrft plot`` with several runs."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from openrft.cli import main
from openrft.data.records import Example
from openrft.engine.rollouts import RolloutGroup
from openrft.engine.samples import SampleLog, sample_records
from openrft.rewards.types import RewardOutcome
from openrft.rollout.types import Completion
from openrft.service.app import create_app
from openrft.service.config import ServiceConfig
from openrft.service.store import Store
from openrft.service.store.models import Job
from openrft.service.store.samples import SampleFilter
from tests.monitoring.test_dashboard_api import ROWS
from tests.service.conftest import database_url  # noqa: F401 (the fixture: SQLite, and PostgreSQL when CI has one)


def _group(example_id: str, scores: list[float | None], version: int = 0) -> RolloutGroup:
    example = Example(id=example_id, messages=[{"role": "user", "content": f"What is {example_id}?"}])
    completions = [Completion([1], [5, 6], [-0.1, -0.2], f"answer {i}", "stop", version) for i in range(len(scores))]
    outcomes = [
        RewardOutcome(score=s, sub_scores={"exact": s}, explanations={"judge": f"says {s}"})
        if s is not None
        else RewardOutcome.failure("timeout", "no answer in 1s")
        for s in scores
    ]
    return RolloutGroup(example, [1], completions, outcomes)


def records(kind: str, step: int) -> list[dict]:
    groups = [_group("e1", [1.0, 0.0]), _group("e2", [0.5, None])]
    return sample_records(kind, step, groups, "combined", learner_version=0)


def _job(owner: str, name: str, lr: float) -> Job:
    spec = {"name": name, "optimizer": {"lr": lr}, "data": {"train": "/srv/data/train.jsonl"}, "metadata": {"k": 1}}
    return Job(
        id=f"ftjob-{name}-{owner[-8:]}",
        owner=owner,
        api="nova",
        status="succeeded",
        request={},
        spec=spec,
        model="openrft-demo",
        display_name=name,
        total_steps=3,
    )


@pytest.fixture
def served(tmp_path, database_url):  # noqa: F811
    store = Store.open(database_url)
    (key_a, secret_a), (_, secret_b) = store.create_key("a"), store.create_key("b")
    job = store.create_job(_job(key_a.id, "first", 1e-3))
    other = store.create_job(_job(key_a.id, "second", 2e-3))
    for run, scale in ((job, 1.0), (other, 0.5)):
        for row in ROWS:
            metrics = {k: v * scale for k, v in row.items() if k != "step"}
            store.record_step(run.id, row["step"], metrics, {}, f"Step {row['step']}")
    for step in (0, 1, 2):
        store.add_samples(job.id, records("eval", step), max_bytes=10**9)
        if step:
            store.add_samples(job.id, records("train", step), max_bytes=10**9)
    client = TestClient(create_app(ServiceConfig.build(tmp_path / "data", str(store.engine.url)), store))
    client.headers["Authorization"] = f"Bearer {secret_a}"
    yield client, store, job, other, secret_b
    store.close()


def _samples(client, job, **params):
    response = client.get(f"/v1/fine_tuning/jobs/{job.id}/samples", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_samples_route_pages_filters_and_orders(served):
    client, _, job, _, _ = served
    everything = _samples(client, job, limit=500)["data"]
    assert len(everything) == 3 * 4 + 2 * 4
    first = everything[0]
    assert first["prompt"] == [{"role": "user", "content": "What is e1?"}] and first["response"] == "answer 0"
    assert first["graders"] == {
        "exact": {"score": 1.0, "explanation": None},
        "judge": {"score": None, "explanation": "says 1.0"},
    }

    # pages by offset, in the recording order
    pages, offset = [], 0
    while True:
        page = _samples(client, job, limit=7, offset=offset)
        pages += page["data"]
        offset += 7
        if not page["has_more"]:
            break
    assert [r["id"] for r in pages] == [r["id"] for r in everything]

    evals_at_2 = _samples(client, job, kind="eval", step=2)["data"]
    assert [(r["example_id"], r["sample_index"]) for r in evals_at_2] == [("e1", 0), ("e1", 1), ("e2", 0), ("e2", 1)]
    failed = _samples(client, job, error_kind="timeout")["data"]
    assert len(failed) == 5 and all(r["reward"] is None and r["error_kind"] == "timeout" for r in failed)
    assert _samples(client, job, error_kind="any")["data"] == failed
    assert _samples(client, job, error_kind="parse_error")["data"] == []
    assert len(_samples(client, job, grader="judge", limit=500)["data"]) == 15  # the failed samples have none
    assert _samples(client, job, grader="jud")["data"] == []  # a whole name, not a part of one
    assert {r["reward"] for r in _samples(client, job, min_reward=0.5, limit=500)["data"]} == {0.5, 1.0}
    across = _samples(client, job, kind="eval", example_id="e2")["data"]
    assert [r["step"] for r in across] == [0, 0, 1, 1, 2, 2]  # one prompt's answers over the evaluations

    ordered = [r["reward"] for r in _samples(client, job, order="-reward", limit=500)["data"]]
    assert ordered == sorted(ordered[:15], reverse=True) + [None] * 5  # failed samples last
    newest = _samples(client, job, order="-step", limit=1)["data"][0]
    assert newest["id"] == everything[-1]["id"]

    bad = client.get(f"/v1/fine_tuning/jobs/{job.id}/samples", params={"order": "length"})
    assert bad.status_code == 400 and "order" in bad.text
    assert client.get(f"/v1/fine_tuning/jobs/{job.id}/samples", params={"limit": 0}).status_code == 400


def test_samples_are_tenant_scoped_and_in_the_api_document(served):
    client, _, job, _, secret_b = served
    other = client.get(f"/v1/fine_tuning/jobs/{job.id}/samples", headers={"Authorization": f"Bearer {secret_b}"})
    assert other.status_code == 404
    dashboard = client.get(f"/v1/dashboard/jobs/{job.id}/samples", headers={"Authorization": f"Bearer {secret_b}"})
    assert dashboard.status_code == 404
    assert "/v1/fine_tuning/jobs/{job_id}/samples" in client.get("/openapi.json").json()["paths"]


def test_the_store_keeps_samples_under_the_cap_and_forgets_steps_a_resumed_run_replays(served):
    _, store, job, _, _ = served
    size = sum(len(json.dumps(r).encode()) for r in records("train", 9))
    store.add_samples(job.id, records("train", 9), max_bytes=2 * size)
    rows, _ = store.list_samples(job.id, SampleFilter(), limit=500)
    assert {r["step"] for r in rows[-4:]} == {9} and len(rows) <= 8  # the newest kept, the oldest dropped
    store.truncate_after(job.id, 2)
    rows, _ = store.list_samples(job.id, SampleFilter(), limit=500)
    assert all(r["step"] <= 2 for r in rows)


def test_the_dashboard_lists_recorded_steps_and_compares_runs(served):
    client, _, job, other, _ = served
    overview = client.get(f"/v1/dashboard/jobs/{job.id}/samples").json()
    assert overview["graders"] == ["exact", "judge"]
    assert {"kind": "eval", "step": 1, "samples": 4, "mean_reward": 0.5, "errors": 1} in overview["steps"]

    compared = client.get("/v1/dashboard/compare", params={"jobs": f"{job.id},{other.id}"}).json()
    train = next(c for c in compared["charts"] if c["title"] == "Train reward")
    assert [line["values"] for line in train["lines"]] == [[0.5, 0.75, 0.625], [0.25, 0.375, 0.3125]]
    assert [line["name"] for line in train["lines"]] == [j["label"] for j in compared["jobs"]]
    assert compared["settings"][0] == {"name": "name", "values": ["first", "second"], "differs": True}
    lr = next(s for s in compared["settings"] if s["name"] == "optimizer.lr")
    assert lr["values"] == ["0.001", "0.002"] and lr["differs"]
    assert "/srv/" not in json.dumps(compared) and "metadata.k" not in json.dumps(compared)
    one = client.get("/v1/dashboard/compare", params={"jobs": job.id})
    assert one.status_code == 400 and "compare 2 to" in one.text


def test_jobs_samples_reads_a_run_directory(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text("{}")
    log = SampleLog(run_dir, 10**6)
    log.write(records("eval", 0))
    log.write(records("train", 1))
    assert main(["jobs", "samples", str(run_dir), "--json", "--kind", "train", "--order=-reward"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["step"], r["reward"]) for r in lines] == [(1, 1.0), (1, 0.5), (1, 0.0), (1, None)]
    assert all({"step", "prompt", "response", "reward"} <= set(r) for r in lines)

    assert main(["jobs", "samples", str(run_dir), "--error-kind", "any"]) == 0
    text = capsys.readouterr().out
    assert "error timeout" in text and "prompt:   What is e2?" in text and text.count("example") == 2

    assert main(["jobs", "samples", str(tmp_path)]) == 2  # not a run directory
    assert "no spec.json" in capsys.readouterr().err


def test_plot_overlays_several_runs(tmp_path):
    for name, scale in (("a", 1.0), ("b", 0.5)):
        (tmp_path / name).mkdir()
        rows = [{k: (v * scale if k != "step" else v) for k, v in r.items()} for r in ROWS]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    output = tmp_path / "both.png"
    assert main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(output)]) == 0
    assert output.stat().st_size > 10_000
