"""Per-tenant quotas of CPU- and GPU-seconds (docs/scaling.md, "Quotas of CPU- and GPU-seconds").

The operator sets them (``openrft keys quota``, stored: every server and worker sees them); a tenant cannot.
A job attempt uses what it reserved times how long it ran (``store/usage.py``). Checked twice:

- at submission: refused (429 ``insufficient_quota``, naming the quota) when the tenant has used all of a quota
  the job needs, or the quota is 0 for what the job reserves: it could never start;
- at start: a tenant whose use reached a quota meanwhile (its running jobs count as they run) keeps its next job
  queued, its reason naming the quota ("tenant quota: 3600 CPU-seconds used of 3600"); other tenants' jobs go
  ahead. It starts once the operator raises or resets the quota. A running job is never stopped by its quota.

The operator (the single user of a loopback server without keys) has no quota.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openrft.runtime.placement import job_resources
from openrft.service.errors import ApiError
from openrft.service.store import Store
from openrft.service.store.usage import Quota, Used
from openrft.service.tenancy import is_operator
from openrft.spec.job import JobSpec


@dataclass(frozen=True)
class Reserved:
    """What a job attempt holds while it runs, for its tenant's quota."""

    cpu: float
    gpu: float


def reserved(spec: JobSpec | None, group: dict[str, float] | None, devices: str | None) -> Reserved:
    """What an attempt reserves: its placement group on the server's cluster (``group``, summed), else its GPUs of
    the workers' machine (``devices``: CUDA_VISIBLE_DEVICES) and its threads. With ``runtime.threads`` unset, a job
    on the workers' machine uses every core it may (``models.configure_threads``: a thread, or a learner process,
    per physical core), and that is what it reserves."""
    if group is not None:
        return Reserved(group.get("CPU", 0.0), group.get("GPU", 0.0))
    if spec is None:  # unreadable: its job process fails it at once
        return Reserved(1.0, 0.0)
    from openrft.models import machine_cpus

    asked = job_resources(spec, None)
    cpu = asked.cpu or float(machine_cpus()[0])
    if devices is not None:
        return Reserved(cpu, float(len([d for d in devices.split(",") if d])))
    return Reserved(cpu, asked.gpu or 0.0)


def may_use_gpu(spec: JobSpec | None, cluster_gpus: float) -> bool:
    """Whether the job would reserve a GPU: ``cuda`` always, ``auto`` where GPUs are there to take."""
    if spec is None or spec.runtime.device == "cpu":
        return False
    return spec.runtime.device.startswith("cuda") or cluster_gpus > 0


def _amount(seconds: float) -> str:
    return f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.3g}"


def exhausted(quota: Quota | None, used: Used, needs_gpu: bool) -> str | None:
    """The quota ``used`` reached (worded for a queue reason or a refusal), else None."""
    if quota is None:
        return None
    if quota.cpu_seconds is not None and used.cpu_seconds >= quota.cpu_seconds:
        return f"tenant quota: {_amount(used.cpu_seconds)} CPU-seconds used of {_amount(quota.cpu_seconds)}"
    if needs_gpu and quota.gpu_seconds is not None and used.gpu_seconds >= quota.gpu_seconds:
        return f"tenant quota: {_amount(used.gpu_seconds)} GPU-seconds used of {_amount(quota.gpu_seconds)}"
    return None


def waiting_reason(store: Store, owner: str, spec: JobSpec | None, gpus: Callable[[], float]) -> str | None:
    """Why ``owner``'s next job cannot start for its quota, else None (the worker's check at start). ``gpus``: the
    GPUs jobs may be given (asked only when the tenant has a quota)."""
    if is_operator(owner):
        return None
    quota = store.quota_for(owner)
    if quota is None:
        return None
    return exhausted(quota, store.used(owner, quota.since), may_use_gpu(spec, gpus()))


def refuse_if_over_quota(store: Store, owner: str, spec: JobSpec, cluster: str | None) -> None:
    """429 ``insufficient_quota`` for a job its tenant's quota leaves no room for (the check at submission)."""
    if is_operator(owner):
        return
    quota = store.quota_for(owner)
    if quota is None:
        return
    gpu = job_resources(spec, cluster).gpu
    needs_gpu = bool(gpu)  # None (device auto, decided at start): checked at start against the cluster's GPUs
    why = exhausted(quota, store.used(owner, quota.since), needs_gpu)
    if why is None and needs_gpu and quota.gpu_seconds == 0 and gpu:
        why = "tenant quota: 0 GPU-seconds allowed and the job reserves GPUs"
    if why is not None:
        raise quota_error(why, "jobs cannot start")


def quota_error(why: str, what: str, headers: dict[str, str] | None = None) -> ApiError:
    """The 429 ``insufficient_quota`` of an exhausted quota (``why``), saying what cannot go on (``what``)."""
    return ApiError(
        429,
        f"{why}; this API key's {what} until the service's operator raises or resets its quota",
        "insufficient_quota",
        headers=headers,
    )


def report(store: Store, owner: str) -> dict[str, Any]:
    """A tenant's quota and use (the quota route and the dashboard): None limits are no limit."""
    quota = None if is_operator(owner) else store.quota_for(owner)
    used = store.used(owner, quota.since if quota else 0.0)
    return {
        "tenant": owner,
        "cpu_seconds": {"used": round(used.cpu_seconds, 3), "limit": quota.cpu_seconds if quota else None},
        "gpu_seconds": {"used": round(used.gpu_seconds, 3), "limit": quota.gpu_seconds if quota else None},
        "since": quota.since if quota and quota.since else None,
        "set_for": None if quota is None else ("every tenant" if quota.owner == "*" else "this tenant"),
        "exhausted": exhausted(quota, used, True) is not None,
    }


def tenants(store: Store) -> list[str]:
    """Every tenant with a quota or use: the API keys' and the local user's (the operator's view)."""
    keys = [k.id for k in store.list_keys()]
    seen = [q.owner for q in store.quotas() if q.owner != "*"] + store.tenants_with_usage()
    return list(dict.fromkeys(keys + [who for who in seen if who not in keys]))
