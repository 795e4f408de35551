"""Datasets and outputs on Google Cloud Storage, against a GCS emulator on 127.0.0.1.

gcsfs reaches the emulator through ``STORAGE_EMULATOR_HOST``, as the Google client libraries do.
The emulator speaks GCS's JSON API but not its gRPC control plane, so gcsfs's experimental
bucket-layout lookup (gRPC) is turned off for these tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openrft.cli import main
from openrft.data.loader import DatasetError, load_dataset
from openrft.storage import StorageError, check_output_location
from tests.conftest import DEMO_DATA
from tests.monitoring.servers import free_port, server_process

# read by gcsfs when it is imported: before any test of this session touches gs://
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
import gcsfs

BUCKET = "openrft-gcs-test"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """An in-memory GCS emulator; the environment points gcsfs at it; the bucket holds the demo datasets."""
    emulator = Path(sys.executable).with_name("gcp-storage-emulator")
    port = free_port()
    argv = [str(emulator), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    log = tmp_path_factory.mktemp("gcs") / "emulator.log"
    with (
        server_process(argv, f"http://127.0.0.1:{port}", log, timeout_s=60) as url,
        pytest.MonkeyPatch.context() as env,
    ):
        env.setenv("STORAGE_EMULATOR_HOST", url)
        fs = gcsfs.GCSFileSystem(token="anon")
        fs.mkdir(BUCKET)
        for name in ("vertex_train.jsonl", "vertex_validation.jsonl", "train.jsonl"):
            fs.put_file(str(DEMO_DATA / name), f"{BUCKET}/data/{name}")
        yield fs


def test_dataset_reads_from_gcs_like_a_local_file(gcs):
    remote = load_dataset(f"gs://{BUCKET}/data/train.jsonl")
    local = load_dataset(str(DEMO_DATA / "train.jsonl"))
    assert [e.messages for e in remote] == [e.messages for e in local] and len(remote) > 10


def test_missing_object_and_bucket_are_named(gcs):
    with pytest.raises(DatasetError) as missing:
        load_dataset(f"gs://{BUCKET}/data/nope.jsonl")
    assert f"gs://{BUCKET}/data/nope.jsonl" in str(missing.value) and "no such object" in str(missing.value)
    with pytest.raises(StorageError, match=r"gs://no-such-bucket-9/out: bucket 'no-such-bucket-9' does not exist"):
        check_output_location("gs://no-such-bucket-9/out")


@pytest.mark.slow
def test_vertex_job_trains_from_gcs_and_a_recipe_uploads_to_it(gcs, demo_recipe, tmp_path, capsys):
    job = {
        "baseModel": "openrft-demo",
        "reinforcementTuningSpec": {
            "trainingDatasetUri": f"gs://{BUCKET}/data/vertex_train.jsonl",
            "validationDatasetUri": f"gs://{BUCKET}/data/vertex_validation.jsonl",
            "hyperParameters": {
                "stepCount": 2,
                "batchSize": 2,
                "samplesPerPrompt": 8,
                "evaluateInterval": 2,
                "maxOutputTokens": 8,
            },
            "singleRewardConfig": {
                "rewardName": "correct",
                "stringMatchRewardScorer": {
                    "correctAnswerReward": 1,
                    "wrongAnswerReward": 0,
                    "stringMatchExpression": {
                        "matchOperation": "EXACT_MATCH",
                        "expression": "{{references.ground_truth_answer}}",
                    },
                },
            },
        },
        "openrft": {"eval_max_examples": 16, "threads": 1},
    }
    path = tmp_path / "vertex_job.json"
    path.write_text(json.dumps(job))
    assert main(["train", str(path), "--output", str(tmp_path / "vertex"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "vertex" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 2

    out = f"gs://{BUCKET}/runs/job-1"
    recipe = demo_recipe(
        run={"data_s3_path": f"gs://{BUCKET}/data/train.jsonl", "output_s3_path": out},
        trainer={"max_steps": 2, "save_steps": 1, "save_top_k": 1},
    )
    staging = tmp_path / "staging"
    assert main(["train", str(recipe), "--staging", str(staging), "--quiet"]) == 0
    assert f"outputs are uploaded to {out}" in capsys.readouterr().out
    names = {p[len(f"{BUCKET}/runs/job-1/") :] for p in gcs.find(f"{BUCKET}/runs/job-1")}
    for name in ("spec.json", "metrics.jsonl", "manifest.json", "summary.json", "adapter/adapter_model.safetensors"):
        assert name in names, name
    remote = gcs.cat(f"{BUCKET}/runs/job-1/adapter/adapter_model.safetensors")
    assert remote == (staging / "adapter" / "adapter_model.safetensors").read_bytes()


def test_gcs_without_its_package_names_the_extra():
    code = (
        "import sys; sys.modules['gcsfs'] = None\n"
        "from openrft.storage import StorageError, read_text\n"
        "try:\n    read_text('gs://b/x.jsonl')\nexcept StorageError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "gs://b/x.jsonl: gs:// locations need gcsfs: pip install 'openrft[gcs]'"
