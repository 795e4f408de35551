"""Vertex-style tuning-job routes (docs/contracts.md §2) over the same store: create, list, get, ``:cancel``,
and ``tuningJobs:validateReinforcementTuningReward``. Served under ``/v1`` (and ``/v1beta1``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from openrft.service import graders
from openrft.service.auth import current_owner
from openrft.service.errors import ApiError
from openrft.service.schemas import TuningJob, TuningJobCreateRequest, TuningJobList, ValidateRewardRequest
from openrft.service.store import NotFound
from openrft.service.tenancy import tenant_config
from openrft.service.views import vertex_job

Owner = Annotated[str, Depends(current_owner)]
BASE = "/projects/{project}/locations/{location}"


def _parent(project: str, location: str) -> str:
    return f"projects/{project}/locations/{location}"


def _vertex(request: Request, owner: str, job_id: str, project: str, location: str) -> TuningJob:
    store = request.app.state.store
    job = store.get_job(owner, job_id)
    cluster = request.app.state.config.ray_address
    return vertex_job(job, _parent(project, location), store.best_checkpoints(job.id, 3), cluster)


def build_router(version: str, include_in_schema: bool = True) -> APIRouter:
    router = APIRouter(prefix=f"/{version}", tags=["vertex"], include_in_schema=include_in_schema)

    @router.post(BASE + "/tuningJobs", response_model=TuningJob)
    def create_tuning_job(
        request: Request, owner: Owner, project: str, location: str, body: TuningJobCreateRequest
    ) -> TuningJob:
        job = request.app.state.submitter.create(owner, body.model_dump(exclude_unset=True), "vertex")
        return _vertex(request, owner, job.id, project, location)

    @router.get(BASE + "/tuningJobs", response_model=TuningJobList)
    def list_tuning_jobs(
        request: Request,
        owner: Owner,
        project: str,
        location: str,
        pageSize: Annotated[int, Query(ge=0, le=100)] = 0,
        pageToken: str | None = None,
    ) -> TuningJobList:
        size = pageSize or 50
        try:
            jobs, more = request.app.state.store.list_jobs(owner, size, pageToken or None)
        except NotFound:
            raise ApiError(
                400, f"pageToken: {pageToken!r} is not a page token of this list", "invalid_page_token", "pageToken"
            ) from None
        checkpoints, cluster = request.app.state.store.best_checkpoints, request.app.state.config.ray_address
        return TuningJobList(
            tuningJobs=[vertex_job(j, _parent(project, location), checkpoints(j.id, 3), cluster) for j in jobs],
            nextPageToken=jobs[-1].id if more and jobs else None,
        )

    @router.get(BASE + "/tuningJobs/{job_id}", response_model=TuningJob)
    def get_tuning_job(request: Request, owner: Owner, project: str, location: str, job_id: str) -> TuningJob:
        return _vertex(request, owner, job_id, project, location)

    @router.post(BASE + "/tuningJobs/{job_id}:cancel")
    def cancel_tuning_job(request: Request, owner: Owner, project: str, location: str, job_id: str) -> dict[str, Any]:
        request.app.state.store.request_cancel(owner, job_id)
        return {}

    @router.post(BASE + "/tuningJobs:validateReinforcementTuningReward")
    async def validate_reward(
        request: Request, owner: Owner, project: str, location: str, body: ValidateRewardRequest
    ) -> dict[str, Any]:
        if (body.singleRewardConfig is None) == (body.compositeRewardConfig is None):
            raise ApiError(
                400,
                "exactly one of singleRewardConfig and compositeRewardConfig is required",
                "invalid_reward",
                "singleRewardConfig",
            )
        tenant = tenant_config(request.app.state.config, owner, request.app.state.store)
        # it runs the reward once: in the grader pool, in the key's turn, 429 when full
        return await graders.in_pool(
            request, owner, graders.validate_vertex_reward, body.model_dump(exclude_none=True), tenant
        )

    return router
