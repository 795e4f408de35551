"""OpenAI fine-tuning routes (docs/contracts.md §3): jobs, events, checkpoints, controls, graders."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request

from openrft.engine.samples import SampleOrder
from openrft.rewards.types import SCORE_LIMIT
from openrft.service import graders
from openrft.service.auth import current_owner
from openrft.service.errors import ApiError
from openrft.service.schemas import (
    FineTuningJob,
    GraderRunRequest,
    GraderValidateRequest,
    JobCheckpoint,
    JobCreateRequest,
    JobEvent,
    Page,
)
from openrft.service.store.samples import SampleFilter
from openrft.service.tenancy import tenant_config
from openrft.service.views import event_seq, openai_checkpoint, openai_event, openai_job
from openrft.spec.job import MAX_STEPS

router = APIRouter(prefix="/v1/fine_tuning", tags=["fine-tuning"])
Owner = Annotated[str, Depends(current_owner)]


def _cluster(request: Request) -> str | None:
    """The server's Ray cluster (``--ray-address``): the job objects' ``resources`` are where it places jobs."""
    return request.app.state.config.ray_address


@router.post("/jobs", response_model=FineTuningJob)
def create_job(request: Request, owner: Owner, body: JobCreateRequest) -> FineTuningJob:
    document = body.model_dump(exclude_unset=True)
    job = request.app.state.submitter.create(owner, document, "openai")
    return openai_job(job, _cluster(request))


@router.get("/jobs", response_model=Page[FineTuningJob])
def list_jobs(
    request: Request, owner: Owner, after: str | None = None, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> Page[FineTuningJob]:
    jobs, more = request.app.state.store.list_jobs(owner, limit, after)
    data = [openai_job(j, _cluster(request)) for j in jobs]
    return Page[FineTuningJob](
        data=data, has_more=more, first_id=data[0].id if data else None, last_id=data[-1].id if data else None
    )


@router.get("/jobs/{job_id}", response_model=FineTuningJob)
def get_job(request: Request, owner: Owner, job_id: str) -> FineTuningJob:
    return openai_job(request.app.state.store.get_job(owner, job_id), _cluster(request))


@router.post("/jobs/{job_id}/cancel", response_model=FineTuningJob)
def cancel_job(request: Request, owner: Owner, job_id: str) -> FineTuningJob:
    return openai_job(request.app.state.store.request_cancel(owner, job_id), _cluster(request))


@router.post("/jobs/{job_id}/pause", response_model=FineTuningJob)
def pause_job(request: Request, owner: Owner, job_id: str) -> FineTuningJob:
    return openai_job(request.app.state.store.request_pause(owner, job_id), _cluster(request))


@router.post("/jobs/{job_id}/resume", response_model=FineTuningJob)
def resume_job(request: Request, owner: Owner, job_id: str) -> FineTuningJob:
    max_queued = request.app.state.submitter.max_queued(owner)
    return openai_job(request.app.state.store.request_resume(owner, job_id, max_queued), _cluster(request))


@router.get("/jobs/{job_id}/events", response_model=Page[JobEvent])
def list_events(
    request: Request,
    owner: Owner,
    job_id: str,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> Page[JobEvent]:
    """Newest first; ``after`` is the id of the last event of the previous page."""
    store = request.app.state.store
    store.get_job(owner, job_id)
    cursor = None
    if after is not None:
        cursor = event_seq(after)
        if cursor is None:
            raise ApiError(400, f"after: {after!r} is not an event id (ftevent-N)", "invalid_cursor", "after")
    events, more = store.list_events(job_id, cursor, limit)
    data = [openai_event(e) for e in events]
    return Page[JobEvent](
        data=data, has_more=more, first_id=data[0].id if data else None, last_id=data[-1].id if data else None
    )


@router.get("/jobs/{job_id}/checkpoints", response_model=Page[JobCheckpoint])
def list_checkpoints(
    request: Request,
    owner: Owner,
    job_id: str,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
) -> Page[JobCheckpoint]:
    """The best three checkpoints by validation reward, best first."""
    store = request.app.state.store
    job = store.get_job(owner, job_id)
    best = store.best_checkpoints(job_id, 3)
    if after is not None:
        ids = [c.id for c in best]
        best = best[ids.index(after) + 1 :] if after in ids else []
    data = [openai_checkpoint(c, job) for c in best[:limit]]
    return Page[JobCheckpoint](
        data=data,
        has_more=len(best) > limit,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


@router.get("/jobs/{job_id}/metrics", response_model=Page[dict[str, Any]], tags=["openrft"])
def list_metrics(request: Request, owner: Owner, job_id: str) -> Page[dict[str, Any]]:
    """OpenRFT: every recorded step's metrics (Nova names), oldest first."""
    store = request.app.state.store
    store.get_job(owner, job_id)
    return Page[dict[str, Any]](data=[{"step": r.step, **r.data} for r in store.metrics(job_id)], has_more=False)


@router.get("/jobs/{job_id}/samples", response_model=Page[dict[str, Any]], tags=["openrft"])
def list_samples(
    request: Request,
    owner: Owner,
    job_id: str,
    kind: Annotated[Literal["train", "eval"] | None, Query(description="training or validation samples")] = None,
    step: Annotated[int | None, Query(ge=0, le=MAX_STEPS, description="the step they were recorded at")] = None,
    example_id: Annotated[str | None, Query(max_length=200, description="one prompt's answers")] = None,
    error_kind: Annotated[
        str | None, Query(max_length=32, description="samples whose reward failed with this kind; 'any': every one")
    ] = None,
    grader: Annotated[str | None, Query(max_length=200, description="samples this grader scored")] = None,
    min_reward: Annotated[float | None, Query(ge=-SCORE_LIMIT, le=SCORE_LIMIT)] = None,
    max_reward: Annotated[float | None, Query(ge=-SCORE_LIMIT, le=SCORE_LIMIT)] = None,
    order: Annotated[SampleOrder, Query(description="'-' first: descending; 'step' is the recording order")] = "step",
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="samples to skip: the page's start")] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Page[dict[str, Any]]:
    """OpenRFT: the job's recorded samples (docs/monitoring.md): the prompt, the response (with its tool turns),
    the reward, each grader's score and explanation, the advantage, the policy age, the error kind of a failed
    reward. Paged by ``offset``: the next page starts at ``offset + limit`` while ``has_more``."""
    store = request.app.state.store
    store.get_job(owner, job_id)
    where = SampleFilter(kind, step, example_id, error_kind, grader, min_reward, max_reward)
    data, more = store.list_samples(job_id, where, order, offset, limit)
    return Page[dict[str, Any]](
        data=data, has_more=more, first_id=data[0]["id"] if data else None, last_id=data[-1]["id"] if data else None
    )


@router.post("/alpha/graders/run")
async def run_grader(request: Request, owner: Owner, body: GraderRunRequest) -> dict[str, Any]:
    """Graders run in a bounded pool of the server, each API key in its turn: 429 with Retry-After when it is
    full or the key has its share; a call whose client hangs up is stopped."""
    tenant = tenant_config(request.app.state.config, owner, request.app.state.store)
    args = (body.grader, body.model_sample, body.item, body.reference_answer, tenant)
    return await graders.in_pool(request, owner, graders.run, *args)


@router.post("/alpha/graders/validate")
def validate_grader(request: Request, owner: Owner, body: GraderValidateRequest) -> dict[str, Any]:
    return graders.validate_grader(body.grader, tenant_config(request.app.state.config, owner, request.app.state.store))
