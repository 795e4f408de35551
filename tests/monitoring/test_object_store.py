"""Datasets and outputs on S3, against a real S3-compatible server (moto's server mode) on 127.0.0.1.

Credentials and the endpoint come the usual way, from the environment (AWS_ACCESS_KEY_ID,
AWS_ENDPOINT_URL_S3), exactly as a user's would.
"""

from __future__ import annotations

import json
import time

import pytest

from openrft.cli import main
from openrft.data.loader import DatasetError, load_dataset
from openrft.storage import StorageError, check_output_location
from tests.conftest import DEMO_DATA
from tests.monitoring.servers import moto_server

pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")

BUCKET = "openrft-test"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server; the environment points boto/s3fs at it; the bucket holds the demo datasets."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with moto_server(log) as endpoint, pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_ENDPOINT_URL_S3", endpoint)
        env.delenv("AWS_PROFILE", raising=False)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        for name in ("train.jsonl", "validation.jsonl"):
            client.upload_file(str(DEMO_DATA / name), BUCKET, f"data/{name}")
        yield client


def _keys(client, prefix: str) -> set[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {obj["Key"][len(prefix) :] for page in pages for obj in page.get("Contents", [])}


def test_dataset_reads_from_s3_like_a_local_file(s3):
    remote = load_dataset(f"s3://{BUCKET}/data/train.jsonl")
    local = load_dataset(str(DEMO_DATA / "train.jsonl"))
    assert [e.messages for e in remote] == [e.messages for e in local] and len(remote) > 10


def test_missing_object_and_bucket_are_named(s3):
    with pytest.raises(DatasetError) as missing:
        load_dataset(f"s3://{BUCKET}/data/nope.jsonl")
    assert f"s3://{BUCKET}/data/nope.jsonl" in str(missing.value) and "no such object" in str(missing.value)
    with pytest.raises(DatasetError) as no_bucket:
        load_dataset("s3://no-such-bucket-8/train.jsonl")
    assert "s3://no-such-bucket-8/train.jsonl" in str(no_bucket.value)
    assert "bucket 'no-such-bucket-8' does not exist" in str(no_bucket.value)
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-8/out: bucket 'no-such-bucket-8' does not exist"):
        check_output_location("s3://no-such-bucket-8/out")


@pytest.mark.slow
def test_nova_recipe_trains_from_s3_and_uploads_its_outputs(s3, demo_recipe, tmp_path, capsys):
    out = f"s3://{BUCKET}/runs/job-1"
    recipe = demo_recipe(
        run={
            "data_s3_path": f"s3://{BUCKET}/data/train.jsonl",
            "validation_data_s3_path": f"s3://{BUCKET}/data/validation.jsonl",
            "output_s3_path": out,
        },
        trainer={"max_steps": 3, "save_steps": 1, "save_top_k": 1},
    )
    staging = tmp_path / "staging"
    assert main(["train", str(recipe), "--staging", str(staging), "--quiet"]) == 0
    assert f"outputs are uploaded to {out}" in capsys.readouterr().out

    keys = _keys(s3, "runs/job-1/")
    for name in (
        "spec.json",
        "metrics.jsonl",
        "manifest.json",
        "summary.json",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    ):
        assert name in keys, name
    assert not any(k.endswith(".tmp") or "/." in k or k.startswith(".") for k in keys)
    # the remote checkpoints are the local ones: pruned to the newest plus the top-1 on both sides
    local_checkpoints = {p.name for p in (staging / "checkpoints").iterdir()}
    remote_checkpoints = {k.split("/")[1] for k in keys if k.startswith("checkpoints/")}
    assert remote_checkpoints == local_checkpoints and "step-000003" in remote_checkpoints
    assert len(remote_checkpoints) <= 2
    for name in ("adapter/adapter_model.safetensors", "metrics.jsonl", "checkpoints/step-000003/trainer_state.pt"):
        body = s3.get_object(Bucket=BUCKET, Key=f"runs/job-1/{name}")["Body"].read()
        assert body == (staging / name).read_bytes(), name
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key="runs/job-1/manifest.json")["Body"].read())
    assert manifest["checkpoint_path"] == f"{out}/adapter"
    assert f"{out}/checkpoints/step-000003" in manifest["checkpoints"]
    summary = json.loads((staging / "summary.json").read_text())
    assert summary["output_uri"] == out and summary["status"] == "succeeded"

    # the same location again is refused before training (it holds a run); a resume would be allowed
    assert main(["train", str(recipe), "--staging", str(tmp_path / "again"), "--quiet"]) == 2
    assert "already holds an OpenRFT run" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["data", "output"])
def test_missing_data_object_or_output_bucket_fails_before_training(s3, demo_recipe, tmp_path, capsys, where):
    run = {"data_s3_path": f"s3://{BUCKET}/data/train.jsonl", "output_s3_path": f"s3://{BUCKET}/runs/job-2"}
    uri = {"data": f"s3://{BUCKET}/data/missing.jsonl", "output": "s3://missing-bucket-8/runs/job-2"}[where]
    run["data_s3_path" if where == "data" else "output_s3_path"] = uri
    staging = tmp_path / "staging"
    started = time.monotonic()
    assert main(["train", str(demo_recipe(run=run)), "--staging", str(staging), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert uri in err, err
    assert ("no such object" if where == "data" else "bucket 'missing-bucket-8' does not exist") in err
    assert not (staging / "spec.json").exists() and not (staging / "checkpoints").exists()
    assert time.monotonic() - started < 30
    if where == "data":  # nothing was uploaded for a job that never started
        assert _keys(s3, "runs/job-2/") == set()


def test_file_uris_read_through_the_same_path(tmp_path):
    uri = (DEMO_DATA / "validation.jsonl").as_uri()
    assert uri.startswith("file:///")
    assert [e.id for e in load_dataset(uri)] == [e.id for e in load_dataset(str(DEMO_DATA / "validation.jsonl"))]
    with pytest.raises(DatasetError, match=r"(?s)file:///.*/nope.jsonl: 1 invalid line.*no such object or file"):
        load_dataset((tmp_path / "nope.jsonl").as_uri())
