"""Workers: claim queued jobs atomically, run each in its own process, heartbeat, reap the dead.

A worker loop, every ``poll_interval``: reaps jobs whose heartbeat expired (any worker may), notices
its finished job processes, heartbeats its running jobs and kills those whose cancel was ignored past
a grace period, then claims new jobs up to its concurrency. Job processes exit when their worker dies.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil

from openrft.disk_full import DISK_FULL_MESSAGE, is_disk_full
from openrft.service.config import ServiceConfig
from openrft.service.exit_codes import RESUME_EXIT
from openrft.service.launchers import ForkLauncher, JobHandle, SpawnLauncher
from openrft.service.store import Store
from openrft.service.store.base import new_id

log = logging.getLogger("openrft.worker")
DISK_FULL_LOG_INTERVAL_S = 60.0


@dataclass
class RunningJob:
    job_id: str
    attempt: int
    process: JobHandle
    cancel_seen_at: float | None = None
    placement_group: str | None = None  # reserved on the server's Ray cluster for this job (admission.py)


class Worker:
    def __init__(
        self,
        store: Store,
        config: ServiceConfig,
        concurrency: int = 1,
        worker_id: str | None = None,
        launcher: SpawnLauncher | ForkLauncher | None = None,
    ):
        self.store = store
        self.config = config
        self.launcher = launcher or SpawnLauncher(config)
        self.concurrency = max(1, concurrency)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{new_id('')[:6]}"
        self.running: dict[str, RunningJob] = {}
        self._last_beat = 0.0
        self._disk_full_logged_at = -DISK_FULL_LOG_INTERVAL_S
        self.admission = None  # with a cluster: jobs start only once their placement group is reserved
        if config.ray_address:
            from openrft.service.admission import for_address

            self.admission = for_address(config.ray_address)
        elif config.gpus:  # this machine's GPUs: each job its own (devices.py)
            from openrft.service.devices import DeviceAdmission

            self.admission = DeviceAdmission(config.gpus, config.jobs_per_gpu)

    # one turn of the loop --------------------------------------------------------------------------------

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_beat >= self.config.heartbeat_interval_s:
            self._last_beat = now
            if self.store.reserve is not None:
                self.store.reserve.ensure()  # laid again once a full disk has room
            self.store.heartbeat(self.worker_id, list(self.running))
            self.store.touch_usage([(r.job_id, r.attempt) for r in self.running.values()])  # tenants' quotas
            for job_id in self.store.reap_expired(self.config.heartbeat_timeout_s, self.config.max_attempts):
                log.warning("requeued job %s: its worker stopped heartbeating", job_id)
            self._reclaim_from_dead_workers()
        self._collect_finished()
        self._enforce_cancels()
        while len(self.running) < self.concurrency:
            if not self._admit_next():
                break

    def _reclaim_from_dead_workers(self) -> None:
        """The jobs of this host's workers whose process is gone (a server killed and restarted) go back to the
        queue within seconds, to resume from their last checkpoint, not once their heartbeat expires. Their job
        processes ended with their worker; on a cluster, their placement groups went with its connection."""
        host = self.worker_id.split(":", 1)[0]
        silent = 3 * self.config.heartbeat_interval_s
        for worker_id in self.store.workers_holding_jobs(f"{host}:"):
            if worker_id != self.worker_id and not _process_alive(worker_id):
                for job_id in self.store.reap_worker(
                    worker_id, "ended (its process is gone)", self.config.max_attempts, silent_s=silent
                ):
                    log.warning("requeued job %s: its worker %s ended", job_id, worker_id)

    def _admit_next(self) -> bool:
        """Claim the next queued job (``_next_fair``). On the server's cluster (or this machine's GPUs) its placement
        group (its GPUs) is reserved first; if its resources are not free, it stays queued with the reason and the
        jobs behind it wait (no overtaking). False when nothing was started."""
        from openrft.service.admission import Decision
        from openrft.spec.job import JobSpec

        job = self._next_fair()
        if job is None:
            return False
        attempt = job.attempts + 1
        try:
            spec = JobSpec.model_validate(job.spec)
        except ValueError:  # a spec this version cannot read: its job process fails it by name, not the queue
            spec = None
        try:
            admitted = spec is not None and self.admission is not None
            decision = self.admission.reserve(job.id, attempt, spec) if admitted else Decision()
        except Exception as exc:  # the cluster is unreachable: the job waits, saying so
            log.warning("admission of job %s failed: %s", job.id, exc)
            decision = Decision(reason=f"cannot reach the Ray cluster: {exc}")
        if decision.reason is not None:
            self.store.set_queue_reason(job.id, decision.reason)
            return False
        claimed = self.store.claim_job(self.worker_id, job.id)
        if claimed is None:  # another worker took it, or it was cancelled or paused meanwhile
            if self.admission is not None:
                self.admission.release(job.id)
            return True
        from openrft.service.quotas import reserved

        use = reserved(spec, decision.reserved, decision.devices)  # what its tenant's quota counts while it runs
        self.store.start_usage(claimed.id, claimed.attempts, claimed.owner, use.cpu, use.gpu)
        self._start(claimed.id, claimed.attempts, decision.group, decision.devices)
        return True

    def _next_fair(self):
        """The queued job admission tries next: the next (``queued_heads``: by priority, then oldest) of the tenant
        holding the least of the cluster (its dominant share), ties in the store's round-robin order; the store's
        order alone without a cluster, when it is out of reach or a single tenant waits. A tenant whose use reached
        its quota is passed over, its job queued with the reason (``quotas.py``)."""
        from openrft.service.admission import dominant_shares

        heads = [job for job in self.store.queued_heads() if not self._waits_for_quota(job)]
        if len(heads) <= 1 or self.admission is None:
            return heads[0] if heads else None
        try:
            shares = dominant_shares(self.store.active_specs(), self.admission.totals())
        except Exception as exc:  # the cluster is out of reach: reserve() says so on the job
            log.warning("tenants' shares of the Ray cluster unknown: %s", exc)
            return heads[0]
        return min(heads, key=lambda job: shares.get(job.owner, 0.0))  # min keeps the first of equals

    def _waits_for_quota(self, job) -> bool:
        """Whether ``job``'s tenant has used up a quota the job needs (then it stays queued, saying which)."""
        from openrft.service.quotas import waiting_reason
        from openrft.spec.job import JobSpec

        try:
            spec = JobSpec.model_validate(job.spec)
        except ValueError:
            spec = None
        reason = waiting_reason(self.store, job.owner, spec, self._gpus)
        if reason is not None:
            self.store.set_queue_reason(job.id, reason)
        return reason is not None

    def _gpus(self) -> float:
        """The GPUs jobs may be given: the cluster's, or this machine's the workers hand out; 0 when unknown."""
        try:
            return self.admission.totals().get("GPU", 0.0) if self.admission is not None else 0.0
        except Exception:  # the cluster is out of reach: reserve() says so on the job
            return 0.0

    def _start(self, job_id: str, attempt: int, placement_group: str | None = None, devices: str | None = None) -> None:
        logs = self.config.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        reserved = {"placement_group": placement_group} if placement_group else {}
        if devices is not None:
            reserved["devices"] = devices
        process = self.launcher.start(job_id, attempt, logs / f"{job_id}.log", **reserved)
        self.running[job_id] = RunningJob(job_id, attempt, process, placement_group=placement_group)
        log.info("worker %s started job %s (attempt %d, pid %d)", self.worker_id, job_id, attempt, process.pid)

    def _collect_finished(self) -> None:
        """Forget a finished job process only once its job has an outcome in the store: one that could not
        be recorded (a full disk under the database) is tried again at the next turn, never left running."""
        for job_id, running in list(self.running.items()):
            code = running.process.poll()
            if code is None:
                continue
            if self.admission is not None:  # its placement group goes back to the cluster, before a requeue
                self.admission.release(job_id)  # (a next attempt must not find this attempt's group held)
            self.store.touch_usage([(job_id, running.attempt)])  # its use counts up to its end
            self._process_ended(running, code)
            del self.running[job_id]

    def _process_ended(self, running: RunningJob, code: int) -> None:
        """The job process ended; if it recorded no outcome (killed, out of memory, a crash, a full disk)."""
        job = self.store.get_job(None, running.job_id)
        if job.status not in ("running", "pausing") or job.attempts != running.attempt:
            return
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        if code == 0:
            how = "exit code 0 without recording an outcome"
        if code == RESUME_EXIT:  # its Ray actors were lost (its event says with which node): resume elsewhere
            how = "its Ray actors lost"
        if job.control == "cancel":
            self.store.with_room(
                lambda: self.store.finish(
                    job.id, running.attempt, "cancelled", f"Job cancelled (job process stopped: {how})"
                )
            )
        elif job.attempts >= self.config.max_attempts:
            self.store.with_room(
                lambda: self.store.finish(
                    job.id,
                    running.attempt,
                    "failed",
                    f"Job process ended with {how}",
                    "error",
                    error_code="job_process_died",
                    error_message=f"the job process ended with {how} on {job.attempts} attempts; "
                    f"its output is in the worker's logs/{job.id}.log",
                )
            )
        elif code == RESUME_EXIT and job.control == "pause":  # a pause asked for meanwhile: at that checkpoint
            self.store.with_room(
                lambda: self.store.finish(
                    job.id, running.attempt, "paused", "Job paused at its last checkpoint (its Ray actors were lost)"
                )
            )
        elif code == RESUME_EXIT:
            self.store.with_room(
                lambda: self.store.requeue(
                    job.id, self.worker_id, "Job handed back: its Ray actors were lost; its placement group freed"
                )
            )
        else:
            self.store.with_room(lambda: self.store.requeue(job.id, self.worker_id, f"Job process ended with {how}"))

    def _enforce_cancels(self) -> None:
        if not self.running:
            return
        controls = self.store.controls(list(self.running))
        now = time.monotonic()
        for job_id, running in self.running.items():
            if controls.get(job_id) != "cancel":
                continue
            if running.cancel_seen_at is None:
                running.cancel_seen_at = now
                if self.admission is not None and running.placement_group:
                    # on the cluster the resources go back at once: its actors stop with their placement group
                    self.admission.release(job_id)
            elif now - running.cancel_seen_at > self.config.cancel_grace_s:
                log.warning("job %s ignored its cancel for %.0fs: killing it", job_id, self.config.cancel_grace_s)
                running.process.kill()

    # the loop ------------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        log.info("worker %s polling %s", self.worker_id, self.store.engine.url.render_as_string(hide_password=True))
        try:
            while not stop.is_set():
                try:
                    self.tick()
                except Exception as exc:  # a database hiccup must not kill the worker; the next turn retries
                    self._log_failed_turn(exc)
                stop.wait(self.config.poll_interval_s)
        finally:
            self.shutdown()

    def _log_failed_turn(self, exc: Exception) -> None:
        """A failed turn, with its traceback; a full disk in one line, at most once a minute (it fails every
        turn until there is room)."""
        if not is_disk_full(exc):
            log.exception("worker turn failed")
            return
        now = time.monotonic()
        if now - self._disk_full_logged_at >= DISK_FULL_LOG_INTERVAL_S:
            self._disk_full_logged_at = now
            log.error("worker turn failed: %s (%s); retrying every turn", DISK_FULL_MESSAGE, type(exc).__name__)

    def shutdown(self) -> None:
        """Stop the job processes and hand their jobs back (they resume from their last checkpoint)."""
        for running in self.running.values():
            if running.process.poll() is None:
                running.process.terminate()
        deadline = time.monotonic() + 10
        for running in self.running.values():
            try:
                running.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                running.process.kill()
                running.process.wait(30)
            self.store.touch_usage([(running.job_id, running.attempt)])
            self.store.requeue(running.job_id, self.worker_id, "Worker shut down")
            if self.admission is not None:
                self.admission.release(running.job_id)
        self.running.clear()


def _process_alive(worker_id: str) -> bool:
    """Whether the process of a worker id of this host (``HOST:PID:...``) runs; True when unsure (another pid
    namespace may have written it: its heartbeat decides)."""
    try:
        pid = int(worker_id.split(":")[1])
    except (IndexError, ValueError):
        return True
    return psutil.pid_exists(pid)


def start_in_thread(worker: Worker) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), name="openrft-worker", daemon=True)
    thread.start()
    return thread, stop
