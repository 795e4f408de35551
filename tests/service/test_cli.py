"""``openrft jobs ...`` and the SDK against a real server: local datasets are uploaded, events followed."""

from __future__ import annotations

import json

import pytest
import yaml

from openrft import Client
from tests.service.svc_helpers import TRAIN, VALIDATION, small_dataset, tiny_recipe

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_cli_creates_follows_and_lists_a_job(service, tmp_path):
    service.serve(workers=1)
    small_dataset(tmp_path / "train.jsonl", TRAIN, 16)
    small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(tiny_recipe("train.jsonl", "validation.jsonl", steps=2)))

    created = service.cli("jobs", "create", str(tmp_path / "recipe.yaml"), "--json")
    assert created.returncode == 0, created.stderr
    job = json.loads(created.stdout)
    assert job["status"] == "queued" and job["training_file"].startswith("file-")  # uploaded, not a path

    followed = service.cli("jobs", "events", job["id"], "--follow")
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert "Step 2/2" in followed.stdout and lines[-1].endswith("The job has successfully completed")

    listed = service.cli("jobs", "list")
    assert listed.returncode == 0 and job["id"] in listed.stdout and "succeeded" in listed.stdout
    checkpoints = service.cli("jobs", "checkpoints", job["id"])
    assert checkpoints.returncode == 0 and f"ftckpt-{job['id'].removeprefix('ftjob-')}" in checkpoints.stdout
    again = service.cli("jobs", "cancel", job["id"])
    assert again.returncode == 2 and "409" in again.stderr

    with Client(service.base_url) as client:
        finished = client.get_job(job["id"])
        assert finished.status == "succeeded" and finished.step == 2
        assert [m["step"] for m in client.metrics(job["id"])] == [0, 1, 2]
        assert [f.id for f in client.list_files("fine-tune")][-1] == job["training_file"]  # newest first
        assert [j.id for j in client.iter_jobs(page_size=1)] == [job["id"]]
