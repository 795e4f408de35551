"""The dashboard's data routes on a real SQLite store, in process: summaries with the latest rewards, the
chart series of ``openrft.charts`` (what ``openrft plot`` draws), events, checkpoints, keys and tenants."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from openrft.charts import CHARTS, charts_data
from openrft.cli import main
from openrft.service.app import create_app
from openrft.service.config import ServiceConfig
from openrft.service.store import CheckpointRecord, Store
from openrft.service.store.models import Job

ROWS = [
    {"step": 0, "val-score/rewards/mean@2": 0.25},
    {
        "step": 1,
        "critic/rewards/mean": 0.5,
        "critic/rewards/min": 0.0,
        "critic/rewards/max": 1.0,
        "actor/kl": 0.0,
        "reward/errors/timeout": 1.0,
    },
    {
        "step": 2,
        "critic/rewards/mean": 0.75,
        "critic/rewards/min": 0.5,
        "critic/rewards/max": 1.0,
        "val-score/rewards/mean@2": 0.5,
        "actor/kl": 0.01,
        "reward/errors/timeout": 0.0,
        "reward/errors/exception": 2.0,
    },
    {
        "step": 3,
        "critic/rewards/mean": 0.625,
        "critic/rewards/min": 0.25,
        "critic/rewards/max": 1.0,
        "actor/kl": 0.02,
        # a run generating with an engine (vLLM): the rollout correction's mismatch metrics
        "rollout_correction/kl": 0.004,
        "rollout_correction/ratio_mean": 0.99,
        "rollout_correction/ratio_std": 0.05,
        "rollout_correction/masked_fraction": 0.0,
        "rollout_correction/truncated_fraction": 0.125,
        "rollout_correction/missing_logprobs": 3.0,
    },
]


def _job(owner: str, status: str = "running", name: str = "arith") -> Job:
    return Job(
        id=f"ftjob-{owner}-{name}",
        owner=owner,
        api="nova",
        status=status,
        request={},
        spec={"name": name},
        model="openrft-demo",
        display_name=name,
        total_steps=10,
    )


@pytest.fixture
def served(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'openrft.db'}")
    (key_a, secret_a), (key_b, secret_b) = store.create_key("a"), store.create_key("b")
    job = store.create_job(_job(key_a.id))
    for row in ROWS:
        metrics = {k: v for k, v in row.items() if k != "step"}
        store.record_step(job.id, row["step"], metrics, {}, f"Step {row['step']}/10")
    store.sync_checkpoints(job.id, [CheckpointRecord(2, "/srv/runs/x/checkpoints/step-000002", 0.5, {})])
    other = store.create_job(_job(key_b.id, "succeeded", "other"))
    client = TestClient(create_app(ServiceConfig.build(tmp_path / "data", str(store.engine.url)), store))
    yield client, job, {"a": secret_a, "b": secret_b, "b_job": other.id}
    store.close()


def _as(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_job_list_has_latest_rewards_and_tenant_isolation(served):
    client, job, keys = served
    page = client.get("/v1/dashboard/jobs", headers=_as(keys["a"])).json()
    assert [j["id"] for j in page["data"]] == [job.id]
    summary = page["data"][0]
    # train reward from the latest step (3); validation from the latest step that evaluated (2)
    assert summary["train_reward"] == 0.625 and summary["validation_reward"] == 0.5
    assert summary["step"] == 3 and summary["total_steps"] == 10
    assert summary["dialect"] == "nova" and summary["model"] == "openrft-demo" and summary["active"] is True
    assert summary["status"] == "running" and summary["created_at"] > 0 and summary["finished_at"] is None

    other = client.get("/v1/dashboard/jobs", headers=_as(keys["b"])).json()["data"]
    assert [j["id"] for j in other] == [keys["b_job"]] and other[0]["active"] is False
    assert other[0]["train_reward"] is None and other[0]["validation_reward"] is None
    assert client.get(f"/v1/dashboard/jobs/{job.id}", headers=_as(keys["b"])).status_code == 404
    assert client.get("/v1/dashboard/jobs").status_code == 401
    assert client.get(f"/v1/dashboard/jobs/{job.id}").status_code == 401


def test_job_page_draws_the_plot_series(served):
    client, job, keys = served
    page = client.get(f"/v1/dashboard/jobs/{job.id}", headers=_as(keys["a"])).json()
    assert [c["title"] for c in page["charts"]] == [c.title for c in CHARTS]
    assert page["charts"] == [c.to_json() for c in charts_data(ROWS)]
    train, validation = page["charts"][0], page["charts"][1]
    assert train["lines"] == [{"name": "critic/rewards/mean", "steps": [1, 2, 3], "values": [0.5, 0.75, 0.625]}]
    assert train["band"]["low"]["values"] == [0.0, 0.5, 0.25] and train["band"]["high"]["values"] == [1.0] * 3
    assert validation["lines"][0]["name"] == "val-score/rewards/mean@2"  # the k the run used
    assert validation["lines"][0]["steps"] == [0, 2] and validation["points"] == 2
    errors = next(c for c in page["charts"] if c["title"] == "Reward errors")
    assert [(s["name"], s["steps"], s["values"]) for s in errors["lines"]] == [
        ("reward/errors/exception", [2], [2.0]),
        ("reward/errors/timeout", [1, 2], [1.0, 0.0]),
    ]
    mismatch = {c["title"]: [(s["name"], s["steps"], s["values"]) for s in c["lines"]] for c in page["charts"]}
    assert mismatch["Engine mismatch KL"] == [("rollout_correction/kl", [3], [0.004])]
    assert mismatch["Engine ratio (mean, spread)"] == [
        ("rollout_correction/ratio_mean", [3], [0.99]),
        ("rollout_correction/ratio_std", [3], [0.05]),
    ]
    assert mismatch["Engine tokens masked / capped"] == [
        ("rollout_correction/masked_fraction", [3], [0.0]),
        ("rollout_correction/truncated_fraction", [3], [0.125]),
    ]
    assert mismatch["Engine log-probs missing"] == [("rollout_correction/missing_logprobs", [3], [3.0])]

    assert page["checkpoints"] == [
        {
            "id": page["checkpoints"][0]["id"],
            "step": 2,
            "val_reward": 0.5,
            "created_at": page["checkpoints"][0]["created_at"],
        }
    ]
    assert "/srv/" not in str(page)  # no server paths
    messages = [e["message"] for e in page["events"]]
    assert messages[0].startswith("Created fine-tuning job") and "Step 3/10" in messages
    last = page["events"][-1]["seq"]
    again = client.get(f"/v1/dashboard/jobs/{job.id}", params={"after_event": last}, headers=_as(keys["a"])).json()
    assert again["events"] == []


def test_page_and_assets_need_no_key_and_are_served_from_the_package(served):
    client, _, _ = served
    html = client.get("/")
    assert html.status_code == 200 and "/dashboard/static/vendor/uPlot.iife.min.js" in html.text
    assert "http://" not in html.text and "https://" not in html.text  # nothing from a CDN
    script = client.get("/dashboard/static/vendor/uPlot.iife.min.js")
    assert script.status_code == 200 and "uPlot" in script.text
    assert client.get("/dashboard/static/dashboard.js").status_code == 200
    assert "/v1/dashboard/jobs" not in client.get("/openapi.json").text  # UI routes stay out of the API document


def test_plot_draws_the_same_charts(tmp_path):
    import json

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert main(["plot", str(run_dir), "--all", "-o", str(tmp_path / "all.png")]) == 0
    assert (tmp_path / "all.png").stat().st_size > 10_000
