"""A Nova MTRL recipe through the service's Nova route, as a user sends it: datasets as uploaded file ids, the
job trains its steps and records pass@k validation metrics (the recipe's own parsing: tests/spec/test_mtrl.py)."""

from __future__ import annotations

import httpx
import pytest
import yaml

from tests.engine.test_mtrl_training import mtrl_recipe
from tests.service.svc_helpers import TRAIN, VALIDATION, Service, small_dataset, upload, wait_status

pytestmark = pytest.mark.slow


def test_an_mtrl_recipe_trains_through_the_nova_route(tmp_path):
    service = Service(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    try:
        service.serve(workers=1)
        with httpx.Client(base_url=service.base_url, timeout=60) as client:
            recipe = yaml.safe_load(mtrl_recipe(tmp_path, "cispo").read_text())
            recipe["run"]["data_s3_path"] = upload(client, small_dataset(tmp_path / "t.jsonl", TRAIN, 16))
            recipe["run"]["validation_data_s3_path"] = upload(
                client, small_dataset(tmp_path / "v.jsonl", VALIDATION, 8)
            )
            created = client.post("/v1/nova/jobs", json=recipe)
            assert created.status_code == 200, created.text
            job = wait_status(client, created.json()["id"], ("succeeded", "failed"), timeout=300)
            assert job["status"] == "succeeded", job
            rows = client.get(f"/v1/fine_tuning/jobs/{job['id']}/metrics", params={"limit": 100}).json()["data"]
            assert [r["step"] for r in rows if "loss" in str(r)][-1] == 2, rows
            assert any(k.startswith("val-score/pass@") for r in rows for k in r.get("metrics", r)), rows
    finally:
        service.stop_all()
