"""A full disk (issue 24): lines are appended whole or not at all and a torn one is trimmed on resume; a
submission on a full database disk is 507; a job whose disk fills fails with a clear error without server
paths; a worker records a dead job's outcome before forgetting it.

Full disks are real: small tmpfs mounts (the tests need root to mount them, as CI's container has). The
worker test uses a failing layer instead: the store's write raises SQLite's "database or disk is full" once.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from openrft.disk_full import append_line, is_disk_full, trim_torn_tail
from openrft.engine.metrics import MetricsSink, read_metrics, truncate_metrics_file
from openrft.service.config import ServiceConfig
from openrft.service.store import Store
from openrft.service.worker import Worker
from tests.service.svc_helpers import TRAIN, VALIDATION, Service, small_dataset, tiny_recipe, upload, wait_status
from tests.service.test_store import make_job


@contextlib.contextmanager
def small_disk(path: Path, size: str = "4m"):
    """A tmpfs of ``size`` mounted at ``path`` (root only: mount(2) needs CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs in CI: {mounted.stderr.decode()}")
        pytest.skip(f"cannot mount a tmpfs here (root needed): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk``."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("ab") as out:
        while True:
            out.write(b"\0" * (1 << 16))
            out.flush()
    return filler


def test_metrics_lines_are_whole_on_a_full_disk(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        sink = MetricsSink(disk, tensorboard=False)
        metrics = {f"metric/{i}": i * 0.001 for i in range(300)}  # ~6 KB a line: the disk fills mid-line
        with pytest.raises(OSError) as info:
            for step in range(10_000):
                sink.emit(step, metrics)
        assert is_disk_full(info.value)
        text = (disk / "metrics.jsonl").read_text()
        assert text.endswith("\n")
        rows = [json.loads(line) for line in text.splitlines()]
        assert [r["step"] for r in rows] == list(range(len(rows))) and len(rows) > 10


def test_a_torn_last_line_is_trimmed_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for step in range(3):
        append_line(path, json.dumps({"step": step, "x": 1.0}))
    with path.open("a") as f:
        f.write('{"step": 3, "x": 1.')  # a crash in the middle of a write
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2]
    truncate_metrics_file(path, 5)  # what a resume does
    assert path.read_text().endswith("\n") and [r["step"] for r in read_metrics(path)] == [0, 1, 2]
    assert not trim_torn_tail(path)


def test_a_worker_records_a_dead_jobs_outcome_before_forgetting_it(tmp_path):
    """Before: the job was forgotten first, the write failed on the full disk, and it stayed running."""
    config = ServiceConfig.build(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}", max_attempts=1)
    store = Store.open(config.database_url)

    class Exits:
        def __init__(self, code: int):
            self.code = code

        def start(self, job_id: str, attempt: int, log: Path):
            return subprocess.Popen([sys.executable, "-c", f"raise SystemExit({self.code})"])

    try:
        for code in (1, 0):  # a crash, and an exit without an outcome
            job = make_job(store)
            worker = Worker(store, config, launcher=Exits(code))
            worker.tick()
            assert list(worker.running) == [job.id]
            worker.running[job.id].process.wait(30)
            real_finish = store.finish
            calls = []

            def full_disk(*args, calls=calls, **kwargs):
                calls.append(args)
                raise OperationalError("UPDATE jobs ...", {}, Exception("database or disk is full"))

            store.finish = full_disk
            with pytest.raises(OperationalError):
                worker.tick()
            assert calls and job.id in worker.running  # not forgotten: the outcome is not recorded yet
            store.finish = real_finish
            worker.tick()
            assert job.id not in worker.running
            recorded = store.get_job(None, job.id)
            assert recorded.status == "failed" and recorded.error_code == "job_process_died"
            assert str(config.data_dir) not in recorded.error_message
            if code == 0:
                assert "without recording an outcome" in recorded.error_message
    finally:
        store.close()


@pytest.fixture
def files(tmp_path):
    return (
        small_dataset(tmp_path / "train.jsonl", TRAIN, 16),
        small_dataset(tmp_path / "valid.jsonl", VALIDATION, 4),
    )


def test_a_submission_on_a_full_database_disk_is_507(tmp_path, files):
    with small_disk(tmp_path / "disk", "6m") as disk:
        service = Service(disk / "data", f"sqlite:///{disk / 'openrft.db'}")
        try:
            service.serve(workers=0)
            with httpx.Client(base_url=service.base_url, timeout=60) as client:
                train, valid = upload(client, files[0]), upload(client, files[1])
                fill(disk)
                body = tiny_recipe(train, valid)
                response = client.post("/v1/nova/jobs", json=body)
                assert response.status_code == 507, response.text
                error = response.json()["error"]
                assert error["code"] == "insufficient_storage" and "disk is full" in error["message"]
                assert str(disk) not in response.text
                assert client.get("/health").status_code == 200
                (disk / "filler").unlink()
                assert client.post("/v1/nova/jobs", json=body).status_code == 200  # space again: accepted
        finally:
            service.stop_all()


def test_a_job_whose_disk_is_full_fails_with_a_clear_error_and_no_server_path(tmp_path, files):
    with small_disk(tmp_path / "disk", "24m") as disk:
        service = Service(disk / "data", f"sqlite:///{tmp_path / 'openrft.db'}")  # the database has room
        try:
            service.serve(workers=1)
            with httpx.Client(base_url=service.base_url, timeout=60) as client:
                train, valid = upload(client, files[0]), upload(client, files[1])
                (disk / "data" / "logs").mkdir(exist_ok=True)
                fill(disk)
                created = client.post("/v1/nova/jobs", json=tiny_recipe(train, valid))
                assert created.status_code == 200, created.text
                job = wait_status(client, created.json()["id"], ("failed", "succeeded"), timeout=180)
            assert job["status"] == "failed", job
            assert job["error"]["code"] == "insufficient_storage" and "disk is full" in job["error"]["message"]
            assert str(disk) not in json.dumps(job)
        finally:
            service.stop_all()
            time.sleep(0.2)


def test_samples_lines_are_whole_trimmed_on_resume_and_carry_any_text(tmp_path):
    """samples.jsonl as metrics.jsonl: a torn last line trimmed on resume; a lone surrogate from a dataset's
    JSON (``\\ud800``, which UTF-8 cannot encode) written escaped instead of failing the job."""
    from openrft.engine.samples import SampleLog, read_samples

    log = SampleLog(tmp_path, 1 << 20)
    log.write([{"step": 1, "prompt": "a\ud800b"}, {"step": 2, "prompt": "日本"}])
    with log.path.open("a") as f:
        f.write('{"step": 3, "prompt": "cut sh')  # a crash in the middle of a write
    log.truncate_after(2)
    assert [(r["step"], r["prompt"]) for r in read_samples(tmp_path)] == [(1, "a\ud800b"), (2, "日本")]
    assert "日本" in log.path.read_text(encoding="utf-8")  # UTF-8 kept where it can be


def test_a_job_whose_disk_fills_mid_run_fails_within_seconds_and_resumes_once_there_is_space(tmp_path, files):
    """Before: a job whose disk filled after its second step stayed `running` for minutes, its log growing a
    traceback every half second. Now it fails with insufficient_storage within seconds, its last checkpoint and
    its metrics whole, and once there is space it resumes from that checkpoint and succeeds."""
    with small_disk(tmp_path / "disk", "40m") as disk:
        service = Service(disk / "data", f"sqlite:///{disk / 'data' / 'openrft.db'}")  # all on the one disk
        try:
            service.serve(workers=1)
            with httpx.Client(base_url=service.base_url, timeout=60) as client:
                train, valid = upload(client, files[0]), upload(client, files[1])
                recipe = tiny_recipe(train, valid, steps=12)
                recipe["openrft"]["tensorboard"] = True  # its writer thread too
                created = client.post("/v1/nova/jobs", json=recipe)
                assert created.status_code == 200, created.text
                job_id = created.json()["id"]
                deadline = time.monotonic() + 180
                while time.monotonic() < deadline:
                    steps = client.get(f"/v1/fine_tuning/jobs/{job_id}/checkpoints").json()["data"]
                    if len(steps) >= 2:
                        break
                    time.sleep(0.2)
                fill(disk)
                filled = time.monotonic()
                job = wait_status(client, job_id, ("failed", "succeeded"), timeout=120)
                failed_after = time.monotonic() - filled
                assert job["status"] == "failed", job
                assert job["error"]["code"] == "insufficient_storage", job
                assert failed_after < 30, failed_after
                run_dir = disk / "data" / "runs" / job_id
                read_metrics(run_dir / "metrics.jsonl")  # parseable: no torn line
                checkpoints = sorted((run_dir / "checkpoints").glob("step-*"))
                assert checkpoints, list(run_dir.iterdir())
                (disk / "filler").unlink()
                resumed = client.post(f"/v1/fine_tuning/jobs/{job_id}/resume")
                assert resumed.status_code == 200, resumed.text
                job = wait_status(client, job_id, ("failed", "succeeded"), timeout=300)
                assert job["status"] == "succeeded", job
                listed = client.get(f"/v1/fine_tuning/jobs/{job_id}/events", params={"limit": 200}).json()["data"]
                assert any("Resuming from the checkpoint" in e["message"] for e in listed), listed
                steps = [record["step"] for record in read_metrics(run_dir / "metrics.jsonl")]
                assert steps == sorted(set(steps)) and steps[-1] == 12, steps  # one line a step, none lost
        finally:
            service.stop_all()
            time.sleep(0.2)
