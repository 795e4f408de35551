"""The GPUs of the embedded workers' machine, without a cluster: each job gets its own (``openrft serve --gpus``).

Without ``--ray-address`` the workers run jobs as processes of this machine. On a machine with GPUs, a job that
can use one (``runtime.device`` other than ``cpu``) starts only once a GPU is free, with
``CUDA_VISIBLE_DEVICES`` naming its own; until then it stays ``queued`` with the reason. Two jobs share a GPU
only when the operator allows it (``--jobs-per-gpu N``). The GPUs are found with ``nvidia-smi`` (the worker never
initialises CUDA: its forked job processes must start clean), within ``CUDA_VISIBLE_DEVICES`` when it is set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading

from openrft.errors import OpenRFTError
from openrft.runtime.placement import bundles, placed_runtime
from openrft.service.admission import Decision
from openrft.spec.job import JobSpec

DEVICE_ID = re.compile(r"^(\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9a-zA-Z/-]+)$")


def detect_gpus() -> list[str]:
    """This machine's GPUs by index (``nvidia-smi``), or those ``CUDA_VISIBLE_DEVICES`` names; none without."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip().isdigit()]


def parse_gpus(value: str) -> list[str]:
    """``--gpus``: ``auto`` (this machine's), ``none``, or a comma list of indices or UUIDs."""
    if value == "auto":
        return detect_gpus()
    if value == "none":
        return []
    devices = [d.strip() for d in value.split(",")]
    bad = [d for d in devices if not DEVICE_ID.match(d)]
    if bad or len(set(devices)) != len(devices):
        raise OpenRFTError(
            f"--gpus {value!r}: expected auto, none, or distinct GPU indices or UUIDs separated by commas "
            f"(e.g. 0,1,3){f'; {bad[0]!r} is not one' if bad else ''}"
        )
    return devices


def gpus_wanted(spec: JobSpec) -> int:
    """GPUs a job of this machine uses: none on ``cpu``; else one per learner (a local Ray job's actors) or one."""
    if spec.runtime.device == "cpu":
        return 0
    return len(bundles(spec, None)) if placed_runtime(spec, None) == "ray" else 1


class DeviceAdmission:
    """Which job holds which GPU of this machine; a job waits, saying so, until enough are free."""

    def __init__(self, gpus: list[str], jobs_per_gpu: int = 1):
        self.gpus = gpus
        self.jobs_per_gpu = max(1, jobs_per_gpu)
        self.held: dict[str, list[str]] = {}  # job id -> the GPUs it holds
        self._lock = threading.Lock()

    def _free(self) -> list[str]:
        use = {gpu: 0 for gpu in self.gpus}
        for devices in self.held.values():
            for gpu in devices:
                use[gpu] += 1
        return [gpu for gpu in self.gpus if use[gpu] < self.jobs_per_gpu]

    def reserve(self, job_id: str, attempt: int, spec: JobSpec) -> Decision:
        wanted = gpus_wanted(spec)
        with self._lock:
            if wanted == 0:
                return Decision(devices="")  # sees no GPU: a cpu job never takes one by accident
            if wanted > len(self.gpus):
                return Decision(reason=f"waiting for {wanted} GPUs; this machine's workers have {len(self.gpus)}")
            free = self._free()
            if len(free) < wanted:
                return Decision(reason=f"waiting for a GPU of this machine: {wanted} GPU, {len(free)} free")
            self.held[job_id] = free[:wanted]
            return Decision(devices=",".join(free[:wanted]))

    def release(self, job_id: str) -> None:
        with self._lock:
            self.held.pop(job_id, None)

    def totals(self) -> dict[str, float]:
        return {"GPU": float(len(self.gpus) * self.jobs_per_gpu)}
