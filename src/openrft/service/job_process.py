"""One job in its own process: ``python -m openrft.service.job_process JOB_ID --attempt N ...``.

Started by a worker. Runs the engine on the job's spec (resuming from the run directory's latest
checkpoint if there is one), streams metrics, events and checkpoints into the store, polls the store
for pause and cancel between steps, and records the outcome. Exits when its worker dies.

A job whose Ray actors were lost (their node died: ``runtime.ray_faults``) is not failed while attempts remain:
the process says so in an event and exits with ``RESUME_EXIT``; its worker frees the attempt's placement group
and requeues the job, whose next attempt gets a new group on the remaining nodes and resumes from its last
checkpoint. On the last attempt it fails naming the loss (``ray_actors_lost``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
import traceback

from openrft.calls.credentials import drop_operator_secrets
from openrft.calls.outbound import tenant_job
from openrft.data.loader import DatasetError
from openrft.disk_full import DISK_FULL_MESSAGE, is_disk_full
from openrft.engine import JobControl, RFTJob
from openrft.engine.checkpoints import CheckpointManager
from openrft.engine.job import Command
from openrft.errors import CheckpointError, ModelNotFoundError, OpenRFTError, RewardError
from openrft.runtime import runtime_factory
from openrft.runtime.ray_faults import lost_actors
from openrft.service.config import ServiceConfig
from openrft.service.exit_codes import RESUME_EXIT
from openrft.service.metrics_events import checkpoint_metrics, event_data, event_message
from openrft.service.store import CheckpointRecord, Store
from openrft.service.store.base import new_id
from openrft.service.store.models import Job
from openrft.service.tenancy import is_operator
from openrft.service.views import final_model_name
from openrft.spec.errors import SpecError
from openrft.spec.job import JobSpec

ERROR_CODES: tuple[tuple[type[Exception], str], ...] = (
    (DatasetError, "invalid_training_file"),
    (SpecError, "invalid_job"),
    (ModelNotFoundError, "model_not_found"),
    (RewardError, "reward_error"),
    (CheckpointError, "checkpoint_error"),
    (OpenRFTError, "job_error"),
)


class StoreControl(JobControl):
    """Between steps, asks the store whether a pause or cancel was requested."""

    def __init__(self, store: Store, job_id: str):
        self.store = store
        self.job_id = job_id

    def poll(self, step: int) -> Command:
        control = self.store.controls([self.job_id]).get(self.job_id)
        return control if control in ("pause", "cancel") else "continue"  # type: ignore[return-value]


class JobRunner:
    def __init__(
        self, store: Store, config: ServiceConfig, job_id: str, attempt: int, placement_group: str | None = None
    ):
        self.placement_group = placement_group  # reserved for this attempt on the server's cluster (admission.py)
        self.store = store
        self.config = config
        self.job: Job = store.get_job(None, job_id)
        if not is_operator(self.job.owner):  # before anything runs: no operator credential reaches a tenant's URL
            dropped = drop_operator_secrets(os.environ)
            tenant_job(os.environ, config.allow_private_urls)  # its calls out follow the submission's policy
            if dropped:
                print(f"operator credentials kept from this tenant's job: {', '.join(dropped)}", flush=True)
        self.attempt = attempt
        self.spec = JobSpec.model_validate(self.job.spec)
        self.run_dir = config.runs_dir / job_id
        self.checkpoints = CheckpointManager(self.run_dir, self.spec.checkpoint.keep_top_k)
        self.step_metrics: dict[int, dict[str, float]] = {}

    # listeners the engine calls ------------------------------------------------------------------------

    def on_metrics(self, step: int, metrics: dict[str, float]) -> None:
        total = self.spec.training.total_steps
        self.step_metrics[step] = metrics
        self.store.record_step(
            self.job.id, step, metrics, event_data(step, total, metrics), event_message(step, total, metrics)
        )

    def on_samples(self, kind: str, step: int, records: list[dict]) -> None:
        for record in records:  # an error message may name the run directory: no server paths to tenants
            if record["error_message"] and str(self.run_dir) in record["error_message"]:
                record["error_message"] = record["error_message"].replace(str(self.run_dir), f"runs/{self.job.id}")
        self.store.add_samples(self.job.id, records, int(self.spec.tracking.samples_max_mb * 2**20))

    def on_event(self, level: str, message: str) -> None:
        message = self.tenant_text(message)  # no server paths to tenants
        self.store.add_event(self.job.id, level if level in ("info", "warn", "error") else "info", message)
        self.sync_checkpoints()  # the engine announces each saved checkpoint with an event

    def sync_checkpoints(self) -> None:
        records = [
            CheckpointRecord(c.step, c.path, c.val_reward, checkpoint_metrics(c.step, self.step_metrics.get(c.step)))
            for c in self.checkpoints.list()
        ]
        self.store.sync_checkpoints(self.job.id, records)

    # the run ----------------------------------------------------------------------------------------------

    def build(self) -> RFTJob:
        kwargs = {
            "show_progress": False,
            "control": StoreControl(self.store, self.job.id),
            "listeners": (self.on_metrics,),
            "sample_listeners": (self.on_samples,),
            "on_event": self.on_event,
            "agent_base": self.config.agent_base_url,
        }
        # the composition root places the job: its own runtime, or the operator's cluster (--ray-address)
        runtime = runtime_factory(self.on_event, cluster=self.config.ray_address, placement_group=self.placement_group)
        latest = self.checkpoints.latest() if (self.run_dir / "spec.json").exists() else None
        if latest is not None:
            self.store.truncate_after(self.job.id, latest.step)
            self.step_metrics = {r.step: r.data for r in self.store.metrics(self.job.id)}
            self.on_event("info", f"Resuming from the checkpoint at step {latest.step}")
            return RFTJob.from_run_dir(self.run_dir, runtime_factory=runtime, **kwargs)
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        self.store.truncate_after(self.job.id, -1)
        return RFTJob(self.spec, self.run_dir, runtime=runtime(self.spec), **kwargs)

    def tenant_text(self, text: str) -> str:
        """``text`` with the server's paths made relative to the data directory (no server paths to tenants)."""
        return text.replace(str(self.run_dir), f"runs/{self.job.id}").replace(f"{self.config.data_dir}/", "")

    def run(self) -> int:
        try:
            summary = self.build().run()
        except Exception as exc:
            if self.placement_group and self.store.controls([self.job.id]).get(self.job.id) == "cancel":
                # its worker freed the job's placement group on the cancel: its actors were stopped, not lost
                self.store.finish(self.job.id, self.attempt, "cancelled", "Job cancelled (its Ray actors stopped)")
                return 0
            lost = lost_actors(exc)
            if lost is not None and self.attempt < self.config.max_attempts:
                return self.hand_back(lost)
            code = next((c for kind, c in ERROR_CODES if isinstance(exc, kind)), "internal_error")
            message = str(exc) if isinstance(exc, OpenRFTError) else f"{exc.__class__.__name__}: {exc}"
            if lost is not None:
                code = "ray_actors_lost"
                message = f"{lost} on attempt {self.attempt} of {self.config.max_attempts}: {message}"
            if is_disk_full(exc):
                code, message = "insufficient_storage", f"{DISK_FULL_MESSAGE} ({message}); resume the job once "
                message += "there is space: it continues from its last checkpoint"
            message = self.tenant_text(message)
            if code == "internal_error":
                traceback.print_exc()
            param = "training_file" if code == "invalid_training_file" else None
            self.store.with_room(  # on a full disk too: the database's reserve makes room for the outcome
                lambda: self.store.finish(
                    self.job.id,
                    self.attempt,
                    "failed",
                    f"Job failed: {message}",
                    "error",
                    error_code=code,
                    error_message=message,
                    error_param=param,
                )
            )
            return 0
        self.sync_checkpoints()
        status, step = summary["status"], summary["steps"]
        if status == "succeeded":
            self.store.finish(
                self.job.id,
                self.attempt,
                "succeeded",
                "The job has successfully completed",
                fine_tuned_model=final_model_name(self.job),
                trained_tokens=self.store.trained_tokens(self.job.id),
                result_files=[self.result_file()],
            )
        elif status == "paused":
            self.store.finish(self.job.id, self.attempt, "paused", f"Job paused after step {step}; checkpoint saved")
        else:
            self.store.finish(self.job.id, self.attempt, "cancelled", f"Job cancelled after step {step}")
        return 0

    def hand_back(self, lost: str) -> int:
        """The job's Ray actors were lost: say so and exit for its worker to requeue it (``RESUME_EXIT``)."""
        latest = self.checkpoints.latest()
        since = f"its last checkpoint (step {latest.step})" if latest is not None else "the start (no checkpoint yet)"
        self.on_event(
            "warn",
            f"{lost[0].upper()}{lost[1:]} on attempt {self.attempt} of {self.config.max_attempts}; the job is "
            f"requeued and resumes from {since} on the Ray cluster's remaining nodes",
        )
        return RESUME_EXIT

    def result_file(self) -> str:
        """The run's metrics.jsonl as a file of the job's owner (purpose fine-tune-results)."""
        file_id = new_id("file-")
        source = self.run_dir / "metrics.jsonl"
        target = self.config.files_dir / file_id
        shutil.copyfile(source, target)
        self.store.add_file(
            self.job.owner, f"{self.job.id}-metrics.jsonl", "fine-tune-results", target.stat().st_size, file_id, file_id
        )
        return file_id


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit as soon as the worker that started this process is gone (its jobs get requeued)."""

    def loop() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(interval_s)

    threading.Thread(target=loop, name="openrft-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openrft.service.job_process")
    parser.add_argument("job_id")
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--ray-address", default=None, help="the operator's Ray cluster the job runs on")
    parser.add_argument("--placement-group", default=None, help="the placement group its worker reserved for it")
    parser.add_argument("--gpus", default=None, help="CUDA_VISIBLE_DEVICES its worker gave it ('': none)")
    parser.add_argument("--allow-private-urls", action="store_true", help="the server's: tenants' calls unchecked")
    parser.add_argument("--agent-base-url", default=None, help="where agents reach the server (rollout.agent)")
    args = parser.parse_args(argv)
    if args.gpus is not None:  # before anything initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus
        print(f"this job's GPUs: {args.gpus or 'none'} (CUDA_VISIBLE_DEVICES)", flush=True)
    if args.parent_pid:
        watch_parent(args.parent_pid)
    config = ServiceConfig.build(args.data_dir, args.database_url, ray_address=args.ray_address)
    config.allow_private_urls = args.allow_private_urls
    config.agent_base_url = args.agent_base_url
    store = Store.open(config.database_url, run_migrations=False)
    try:
        return JobRunner(store, config, args.job_id, args.attempt, args.placement_group).run()
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
