"""The dashboard's page and JSON routes. Data routes authenticate like the rest of the API (Bearer key)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse

from openrft.service.auth import current_owner
from openrft.service.dashboard import cluster, queries
from openrft.service.errors import ApiError

# UI routes: kept out of the OpenAPI document (docs/openapi.json), which describes the public API
router = APIRouter(tags=["dashboard"], include_in_schema=False)
Owner = Annotated[str, Depends(current_owner)]
INDEX = Path(__file__).parent / "static" / "index.html"


@router.get("/")
def index() -> FileResponse:
    """The dashboard page (job list; ``/?job=ID`` shows one job). It holds no data: no key needed for it."""
    return FileResponse(INDEX, media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get("/v1/dashboard/jobs")
def jobs(request: Request, owner: Owner, limit: Annotated[int, Query(ge=1, le=100)] = 50) -> dict[str, Any]:
    """The tenant's newest jobs with their status, dialect, model, steps and latest rewards."""
    store = request.app.state.store
    rows, more = store.list_jobs(owner, limit, tinker=True)
    cluster = request.app.state.config.ray_address
    return {"data": [queries.job_summary(store, job, cluster) for job in rows], "has_more": more}


@router.get("/v1/dashboard/jobs/{job_id}")
def job(
    request: Request,
    owner: Owner,
    job_id: str,
    after_event: Annotated[int, Query(ge=0, le=2**63 - 1, description="events after this sequence number")] = 0,
) -> dict:
    """One job's page: summary (with the resources it asks for), chart series, checkpoints, new events."""
    store = request.app.state.store
    return queries.job_page(store, store.get_job(owner, job_id), after_event, request.app.state.config.ray_address)


@router.get("/v1/dashboard/cluster")
def cluster_view(request: Request, owner: Owner) -> dict[str, Any]:
    """The cluster: nodes with their CPUs, GPUs and memory, which job holds what, the queue with each job's reason,
    each tenant's use against its quota (the operator sees every tenant's; a tenant its own)."""
    tinker = getattr(request.app.state, "tinker", None)  # its hosts and clients, when the Tinker API is served
    return cluster.cluster_page(request.app.state.store, request.app.state.config, owner, tinker)


@router.get("/v1/dashboard/jobs/{job_id}/samples")
def samples(request: Request, owner: Owner, job_id: str) -> dict[str, Any]:
    """The samples view's choices: recorded steps with their counts and mean rewards, graders, error kinds.
    The samples themselves come from the API's ``/v1/fine_tuning/jobs/{id}/samples``."""
    store = request.app.state.store
    store.get_job(owner, job_id)
    return queries.samples_overview(store, job_id)


MAX_COMPARED = 8


@router.get("/v1/dashboard/compare")
def compare(
    request: Request,
    owner: Owner,
    jobs: Annotated[str, Query(max_length=1000, description="job ids, comma-separated")],
) -> dict[str, Any]:
    """Two or more of the tenant's jobs: curves overlaid and settings side by side."""
    store = request.app.state.store
    ids = list(dict.fromkeys(i.strip() for i in jobs.split(",") if i.strip()))
    if not 2 <= len(ids) <= MAX_COMPARED:
        raise ApiError(400, f"jobs: {len(ids)} job id(s) given; compare 2 to {MAX_COMPARED}", "invalid_request", "jobs")
    return queries.comparison(store, [store.get_job(owner, i) for i in ids])
