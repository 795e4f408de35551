"""Without a cluster, each job of this machine gets its own GPU (``openrft serve --gpus``): a job waits, saying so,
until one is free; never two jobs on one GPU unless the operator allows it (``--jobs-per-gpu``)."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from openrft.errors import OpenRFTError
from openrft.service.devices import DeviceAdmission, parse_gpus
from openrft.spec.job import JobSpec
from tests.service.svc_helpers import TRAIN, VALIDATION, Service, small_dataset, tiny_recipe, upload, wait_status


def spec(device: str = "auto") -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "openrft-demo"},
            "data": {"train": "t.jsonl"},
            "training": {"prompts_per_step": 2, "total_steps": 1},
            "reward": {"function": {"type": "preset", "name": "exact_match"}},
            "runtime": {"device": device},
        }
    )


def test_each_job_holds_its_own_gpu_and_waits_saying_so():
    admission = DeviceAdmission(["0", "1"])
    assert admission.reserve("a", 1, spec()).devices == "0"
    assert admission.reserve("b", 1, spec("cuda")).devices == "1"
    waiting = admission.reserve("c", 1, spec())
    assert waiting.devices is None and waiting.reason == "waiting for a GPU of this machine: 1 GPU, 0 free"
    assert admission.reserve("cpu", 1, spec("cpu")).devices == ""  # a cpu job sees no GPU and holds none
    admission.release("a")
    assert admission.reserve("c", 1, spec()).devices == "0"

    shared = DeviceAdmission(["3"], jobs_per_gpu=2)  # the operator allows two jobs on one GPU
    assert [shared.reserve(j, 1, spec()).devices for j in "xy"] == ["3", "3"]
    assert shared.reserve("z", 1, spec()).reason is not None


def test_the_gpus_option():
    assert parse_gpus("none") == []
    assert parse_gpus("0,2") == ["0", "2"]
    for bad in ("0,0", "a", "0;1", ""):
        with pytest.raises(OpenRFTError, match="--gpus"):
            parse_gpus(bad)


@pytest.mark.slow
def test_three_jobs_on_two_gpus_of_the_server_never_share_one(tmp_path):
    """Three workers, two GPUs named by the operator: two jobs run, each with its own CUDA_VISIBLE_DEVICES, and
    the third waits with its reason until one ends (this machine has no GPU: the jobs train on the CPU, and
    what they were given is read from their logs)."""
    service = Service(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    try:
        service.serve(workers=3, extra=("--gpus", "0,1"))
        with httpx.Client(base_url=service.base_url, timeout=60) as client:
            train = upload(client, small_dataset(tmp_path / "train.jsonl", TRAIN, 16))
            valid = upload(client, small_dataset(tmp_path / "valid.jsonl", VALIDATION, 4))
            ids = [client.post("/v1/nova/jobs", json=tiny_recipe(train, valid, steps=2)).json()["id"] for _ in "abc"]
            reasons = set()
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                jobs = [client.get(f"/v1/fine_tuning/jobs/{i}").json() for i in ids]
                running = [j for j in jobs if j["status"] == "running"]
                assert len(running) <= 2, jobs  # never more jobs running than GPUs
                reasons |= {j.get("queue_reason") for j in jobs if j["status"] == "queued" and j.get("queue_reason")}
                if all(j["status"] in ("succeeded", "failed") for j in jobs):
                    break
                time.sleep(0.2)
            for job_id in ids:
                assert wait_status(client, job_id, ("succeeded", "failed"))["status"] == "succeeded"
        assert "waiting for a GPU of this machine: 1 GPU, 0 free" in reasons, reasons
        given = [
            re.search(r"this job's GPUs: (\S+)", (tmp_path / "data" / "logs" / f"{i}.log").read_text())[1] for i in ids
        ]
        assert sorted(given[:2]) == ["0", "1"] and given[2] in ("0", "1"), given
    finally:
        service.stop_all()
