"""``GET /v1/openrft/quota``: a tenant's CPU- and GPU-seconds used against the quota the operator set
(docs/scaling.md, "Quotas of CPU- and GPU-seconds"); the operator (the single user of a loopback server without keys)
sees every tenant's."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from openrft.service.auth import current_owner
from openrft.service.quotas import report, tenants
from openrft.service.tenancy import is_operator

router = APIRouter(prefix="/v1/openrft", tags=["openrft"])
Owner = Annotated[str, Depends(current_owner)]


def _quotas(store, owner: str) -> dict[str, Any]:
    who = tenants(store) if is_operator(owner) else [owner]
    return {"object": "list", "operator": is_operator(owner), "data": [report(store, t) for t in who]}


@router.get("/quota")
async def quota(request: Request, owner: Owner) -> dict[str, Any]:
    """Each entry: the tenant, its ``cpu_seconds`` and ``gpu_seconds`` (``used``, ``limit``: null for none), since
    when use counts, whose quota applies (``set_for``), and whether one is used up (its jobs then wait)."""
    return await run_in_threadpool(_quotas, request.app.state.store, owner)
