"""The dashboard's cluster view: the nodes jobs run on, which job holds what, the queue with each job's reason, and
each tenant's use against its quota.

Nodes come from Ray's own state (the GCS's node and placement-group tables) when the server has ``--ray-address``,
from this machine otherwise. A tenant sees every node and how much of it is held, its own jobs by id, and other
tenants' jobs only as "another tenant's job"; the operator sees every job and tenant.
"""

from __future__ import annotations

import os
import re
from typing import Any

from sqlalchemy import select

from openrft.service.config import ServiceConfig
from openrft.service.dashboard.queries import job_summary_name
from openrft.service.quotas import report, tenants
from openrft.service.store import Store
from openrft.service.store.jobs import ACTIVE
from openrft.service.store.models import Job
from openrft.service.tenancy import is_operator

GROUP_NAME = re.compile(r"^openrft-(ftjob-[A-Za-z0-9]+)-a(\d+)$")  # admission.group_name
OTHERS = "another tenant's job"


def _ray_nodes(address: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(nodes, placement groups) as Ray's GCS records them."""
    from openrft.service.admission import for_address

    ray = for_address(address)._ray()
    from ray.util import placement_group_table

    nodes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        nodes.append(
            {
                "id": node["NodeID"],
                "address": node.get("NodeManagerAddress"),
                "cpu": resources.get("CPU", 0.0),
                "gpu": resources.get("GPU", 0.0),
                "memory_bytes": resources.get("memory", 0.0),
                "custom": {
                    k: v
                    for k, v in resources.items()
                    if k not in ("CPU", "GPU", "memory", "object_store_memory") and not k.startswith("node:")
                },
                "held": {"cpu": 0.0, "gpu": 0.0},
            }
        )
    groups = []
    for group in placement_group_table().values():
        if group.get("state") != "CREATED":
            continue
        for index, bundle in group["bundles"].items():
            groups.append(
                {
                    "name": group.get("name") or group["placement_group_id"],
                    "node": group["bundles_to_node_id"].get(index),
                    "cpu": bundle.get("CPU", 0.0),
                    "gpu": bundle.get("GPU", 0.0),
                }
            )
    return nodes, groups


def _local_node(config: ServiceConfig) -> dict[str, Any]:
    import psutil

    return {
        "id": "local",
        "address": "this machine (no --ray-address)",
        "cpu": float(os.cpu_count() or 1),
        "gpu": float(len(config.gpus)),
        "memory_bytes": float(psutil.virtual_memory().total),
        "custom": {},
        "held": {"cpu": 0.0, "gpu": 0.0},
    }


def _jobs(store: Store, ids: list[str]) -> dict[str, Job]:
    if not ids:
        return {}
    with store.session() as s:
        return {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(ids)))}


def _who(job: Job | None, owner: str) -> dict[str, Any]:
    """A job as the caller may see it: its own (or, for the operator, any) by id and name; others' anonymous."""
    if job is None:
        return {"job": None, "name": None, "tenant": None}
    if is_operator(owner) or job.owner == owner:
        return {"job": job.id, "name": job_summary_name(job), "tenant": job.owner}
    return {"job": None, "name": OTHERS, "tenant": None}


def holdings(store: Store, config: ServiceConfig, owner: str) -> dict[str, Any]:
    """Nodes and what each job holds: Ray's placement groups on a cluster, the running jobs' reservations here."""
    held: list[dict[str, Any]] = []
    if config.ray_address:
        nodes, groups = _ray_nodes(config.ray_address)
        names = {g["name"]: GROUP_NAME.match(g["name"]) for g in groups}
        jobs = _jobs(store, [m[1] for m in names.values() if m])
        for group in groups:
            match = names[group["name"]]
            job = jobs.get(match[1]) if match else None
            entry = {**_who(job, owner), "group": group["name"], "node": group["node"]}
            if not is_operator(owner) and (job is None or job.owner != owner):  # its name holds the job's id
                entry.update(name=OTHERS if match else "not a job of this service", group=None)
            held.append({**entry, "cpu": group["cpu"], "gpu": group["gpu"]})
        source = "ray"
    else:
        nodes = [_local_node(config)]
        with store.session() as s:
            running = list(s.scalars(select(Job).where(Job.status.in_(ACTIVE), Job.api != "tinker")))
        reserved = store.reserved_now([j.id for j in running])
        for job in running:
            cpu, gpu = reserved.get(job.id, (0.0, 0.0))
            held.append({**_who(job, owner), "group": None, "node": "local", "cpu": cpu, "gpu": gpu})
        source = "local"
    by_id = {n["id"]: n for n in nodes}
    for entry in held:
        node = by_id.get(entry["node"])
        if node is not None:
            node["held"]["cpu"] += entry["cpu"]
            node["held"]["gpu"] += entry["gpu"]
    return {"source": source, "nodes": nodes, "held": held}


def queue(store: Store, owner: str) -> dict[str, Any]:
    """The queued jobs, in each tenant's own order (priority, then age), with what each waits for; a tenant sees
    its own and how many of other tenants' wait."""
    with store.session() as s:
        rows = list(s.scalars(select(Job).where(Job.status == "queued").order_by(Job.priority.desc(), Job.seq)))
    shown = [j for j in rows if is_operator(owner) or j.owner == owner]
    return {
        "jobs": [
            {
                "job": j.id,
                "name": job_summary_name(j),
                "tenant": j.owner,
                "priority": j.priority or 0,
                "reason": j.queue_reason,
                "created_at": j.created_at,
            }
            for j in shown
        ],
        "others_waiting": len(rows) - len(shown),
    }


def cluster_page(store: Store, config: ServiceConfig, owner: str, tinker: Any = None) -> dict[str, Any]:
    """Everything the cluster view draws (``GET /v1/dashboard/cluster``); ``tinker``: the Tinker API's state, whose
    hosts and clients it lists (``tinker/holdings.py``), None when the server has no Tinker API."""
    try:
        placed = holdings(store, config, owner)
    except Exception as exc:  # the cluster is out of reach: the queue and quotas still show
        placed = {"source": "ray", "nodes": [], "held": [], "error": f"cannot reach the Ray cluster: {exc}"}
    who = tenants(store) if is_operator(owner) else [owner]
    clients = None if tinker is None else tinker.holdings(owner)
    if clients is not None and clients["source"] == "ray":  # each TinkerHost actor holds its CPUs on its node
        by_id = {n["id"]: n for n in placed["nodes"]}
        for host in clients["hosts"]:
            if host["node"] in by_id:
                by_id[host["node"]]["held"]["cpu"] += host["cpu"]
                by_id[host["node"]]["held"]["gpu"] += host["gpu"]
    return {**placed, "queue": queue(store, owner), "quotas": [report(store, t) for t in who], "tinker": clients}
