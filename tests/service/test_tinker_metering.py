"""The Tinker API's calls in the jobs' usage store (tinker/metering.py) on a real SQLite or PostgreSQL store: a
tenant's time on each host times the host's CPUs and GPUs, written as one row per tenant and host however many calls
ran (not one write per call), counted by the quotas as a job attempt's use; what is not written yet counts in the
refusal; a reset quota counts from then. tests/tinker_api/test_quota_use.py runs the same through a real server."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from openrft.service.store.models import JobUsage
from openrft.service.tinker import metering
from openrft.service.tinker.metering import Meter

HOSTS = {"": (2.0, 0.0), "node-with-gpu": (1.0, 1.0)}  # the server's 2 threads; an actor with a CPU and a GPU


def test_calls_are_written_per_tenant_and_host_and_count_in_the_quota(store, monkeypatch):
    monkeypatch.setattr(metering, "CACHE_S", 0.0)  # the quota read again at each check
    meter = Meter(store, HOSTS.__getitem__, flush_s=3600)  # written only when flushed here
    try:
        for _ in range(100):
            meter.ran("alice", "", 0.01)  # 100 calls of 10 ms on 2 threads: 2 CPU-seconds
        meter.ran("alice", "node-with-gpu", 0.5)
        meter.ran("bob", "", 0.25)
        store.set_quota("alice", cpu_seconds=1.0, gpu_seconds=None)
        assert store.used("alice").cpu_seconds == 0  # not written yet, and still counted:
        assert meter.refusal("alice") == "tenant quota: 2.5 CPU-seconds used of 1"
        assert meter.refusal("bob") is None  # no quota

        meter.flush()
        with store.session() as s:
            rows = s.scalar(select(func.count()).select_from(JobUsage))
        assert rows == 3  # alice here, alice on the actor, bob here: for 102 calls
        alice, bob = store.used("alice"), store.used("bob")
        assert alice.cpu_seconds == pytest.approx(2.5) and alice.gpu_seconds == pytest.approx(0.5)
        assert bob.cpu_seconds == pytest.approx(0.5) and bob.gpu_seconds == 0
        assert meter.refusal("alice") == "tenant quota: 2.5 CPU-seconds used of 1"

        store.set_quota("alice", cpu_seconds=None, gpu_seconds=0.4)
        assert meter.refusal("alice") == "tenant quota: 0.5 GPU-seconds used of 0.4"
        store.set_quota("alice", cpu_seconds=1.0, gpu_seconds=0.4, reset=True)  # a new period
        assert meter.refusal("alice") is None
        meter.ran("alice", "", 0.6)
        assert meter.refusal("alice") == "tenant quota: 1.2 CPU-seconds used of 1"
        assert meter.refusal("local") is None  # the operator has no quota
    finally:
        meter.close()
