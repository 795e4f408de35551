"""Where the Tinker clients are, for the dashboard's cluster view (dashboard/cluster.py): each host (a TinkerHost
actor's node on the server's Ray cluster, this server process otherwise) with the training clients and sampling
sessions it holds, by tenant. A tenant sees its own clients by id and every other tenant's only as "another
tenant's client", as the view shows other tenants' jobs; the operator sees every one. A training client's
snapshot samplers are part of it (not listed, as they do not count against ``--tinker-clients-per-actor``)."""

from __future__ import annotations

from typing import Any

from openrft.service.tenancy import is_operator

OTHERS = "another tenant's client"
LOCAL = "local"  # the in-process host's node, as the cluster view names this machine


def _client(kind: str, client_id: str, owner: str, base: str, viewer: str) -> dict[str, Any]:
    if is_operator(viewer) or owner == viewer:
        return {"kind": kind, "client": client_id, "tenant": owner, "base_model": base}
    return {"kind": kind, "client": None, "tenant": None, "name": OTHERS}


def holdings(engine, owner: str, on_cluster: bool) -> dict[str, Any]:
    """``{"source": "ray" | "local", "hosts": [{"node", "cpu", "gpu", "clients": [...], "tenants": {...}}]}``:
    ``tenants`` counts each tenant's clients on the host (others' under ``OTHERS``)."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    if on_cluster:
        for node in engine.actor_nodes():
            by_host.setdefault(node, [])
    else:
        by_host[""] = []
    for model in list(engine.models.values()):
        entry = _client("training", model.model_id, model.owner, model.base.name, owner)
        by_host.setdefault(engine.host_of(model), []).append(entry)
    for sampler in list(engine.samplers.values()):
        if sampler.model is None:
            entry = _client("sampling", sampler.sampler_id, sampler.owner, sampler.base.name, owner)
            by_host.setdefault(engine.host_of(sampler), []).append(entry)
    hosts = []
    for host, clients in by_host.items():
        cpu, gpu = engine.resources_of(host)
        tenants: dict[str, int] = {}
        for entry in clients:
            who = entry["tenant"] or OTHERS
            tenants[who] = tenants.get(who, 0) + 1
        hosts.append({"node": host or LOCAL, "cpu": cpu, "gpu": gpu, "clients": clients, "tenants": tenants})
    return {"source": "ray" if on_cluster else "local", "hosts": hosts}
