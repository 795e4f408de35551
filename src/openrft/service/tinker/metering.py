"""The Tinker API's calls in their tenants' quotas of CPU- and GPU-seconds (docs/scaling.md, "Quotas of CPU- and
GPU-seconds"): one accounting with the jobs'. Each turn a call runs on a host's worker (futures.py) is that
tenant's time on the host, times what the host computes with (``engine.resources_of``: the server's threads
in-process, a TinkerHost actor's CPUs and GPUs on a cluster), kept here per tenant and host and written to the
usage store the jobs' attempts are in (``store.add_usage``) every ``FLUSH_S`` and soon after an ``optim_step``:
one write for every tenant's calls of those seconds, never one per call.

A tenant whose use (what is written, plus what is not yet) reached its quota has its new calls refused with the
job routes' error (429 ``insufficient_quota`` naming the quota, ``quotas.quota_error``); calls already queued
run to their end and count. The quota and the written use are read at most every ``CACHE_S`` per tenant.
A server stopped loses at most its last ``FLUSH_S`` of use, as a job's worker its last heartbeat's."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from openrft.service.quotas import exhausted
from openrft.service.store.usage import Quota, Used
from openrft.service.tenancy import is_operator

log = logging.getLogger("openrft.tinker")
FLUSH_S = 5.0  # at most this long between a call's run and its use in the store
CACHE_S = 2.0  # a tenant's quota and written use, read again after this long (or a flush)


class Meter:
    def __init__(self, store, resources: Callable[[str], tuple[float, float]], flush_s: float = FLUSH_S) -> None:
        self.store, self.resources, self.flush_s = store, resources, flush_s
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], tuple[float, float]] = {}  # (owner, host) -> CPU-, GPU-seconds
        self._known: dict[str, tuple[float, Quota | None, Used]] = {}  # owner -> (read when, quota, written use)
        self._uses_gpu = False  # a host with GPUs ran a call: a GPU quota counts
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="openrft-tinker-meter", daemon=True)
        self._thread.start()

    def ran(self, owner: str, host: str, seconds: float) -> None:
        """``owner``'s call held ``host``'s worker ``seconds`` (``Futures.on_ran``)."""
        if not owner or seconds <= 0:
            return
        cpu, gpu = self.resources(host)
        with self._lock:
            was_cpu, was_gpu = self._pending.get((owner, host), (0.0, 0.0))
            self._pending[(owner, host)] = (was_cpu + cpu * seconds, was_gpu + gpu * seconds)
            self._uses_gpu = self._uses_gpu or gpu > 0

    def flush_soon(self) -> None:
        """Write the use soon (an ``optim_step`` ended a step: its use shows with it)."""
        self._wake.set()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        rows = []
        for (owner, _), (cpu_s, gpu_s) in pending.items():
            # one row per tenant and host whose cpu x seconds and gpu x seconds are its CPU- and GPU-seconds
            seconds = max(cpu_s, gpu_s)
            cpu, gpu = (cpu_s / seconds, gpu_s / seconds) if seconds else (0.0, 0.0)
            rows.append(("tinker-" + uuid.uuid4().hex, owner, cpu, gpu, seconds))
        try:
            self.store.add_usage(rows)
        except Exception:  # kept for the next flush: the database may be back by then
            log.exception("Tinker: writing the calls' use failed")
            with self._lock:
                for key, (cpu_s, gpu_s) in pending.items():
                    was_cpu, was_gpu = self._pending.get(key, (0.0, 0.0))
                    self._pending[key] = (was_cpu + cpu_s, was_gpu + gpu_s)
            return
        with self._lock:
            for owner, _ in pending:
                self._known.pop(owner, None)

    def refusal(self, owner: str) -> str | None:
        """The quota ``owner``'s use reached (worded for the refusal), else None. Reads the store at most every
        ``CACHE_S``: call it off the event loop."""
        if is_operator(owner):
            return None
        now = time.monotonic()
        known = self._known.get(owner)
        if known is None or now - known[0] > CACHE_S:
            quota = self.store.quota_for(owner)
            written = self.store.used(owner, quota.since) if quota is not None else Used(0.0, 0.0)
            known = self._known[owner] = (now, quota, written)
        _, quota, written = known
        if quota is None:
            return None
        with self._lock:
            cpu_s = sum(c for (who, _), (c, _g) in self._pending.items() if who == owner)
            gpu_s = sum(g for (who, _), (_c, g) in self._pending.items() if who == owner)
            uses_gpu = self._uses_gpu
        return exhausted(quota, Used(written.cpu_seconds + cpu_s, written.gpu_seconds + gpu_s), uses_gpu)

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_s)
            self._wake.clear()
            if self._pending:
                self.flush()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self.flush()
