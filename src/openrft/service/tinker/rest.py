"""The ``RestClient`` routes of the Tinker SDK (0.38): training runs, sessions and checkpoints, each of the
caller's tenant (another tenant's read as not found), answered as the SDK's own types (``tinker.types``).

- ``GET /training_runs`` (``limit``, ``offset``), ``GET /training_runs/{id}``: the tenant's training clients,
  from the job store (``records.py``) so that they outlive the server, newest first, with their newest
  checkpoint of each kind.
- ``GET /sessions`` (``limit``, ``offset``), ``GET /sessions/{id}``: the sessions of those runs and the live ones.
- ``GET /training_runs/{id}/checkpoints``, ``GET /checkpoints`` (``limit``, ``offset``): checkpoints by run, or all.
- ``DELETE /training_runs/{id}/checkpoints/{kind}/{name}``: its files and its row in the job store.
- ``POST``/``DELETE .../publish``: published, any tenant may read it by its path (load it, sample it, its
  ``weights_info``); only its owner lists, changes or deletes it.
- ``PUT .../ttl``: it expires (reads as not found, then removed) ``ttl_seconds`` from now, or never.
- ``POST /save_weights_external``: the adapter as a PEFT directory (``adapter_model.safetensors``,
  ``adapter_config.json``) at ``tinker://ID/external_weights/NAME``; ``GET .../external_weights_urls`` answers
  a URL per file, signed by this server (an HMAC of the tenant, path, file and expiry with a key made when the
  server starts), which a plain GET without the API key downloads for an hour or until the server restarts.

A failure on the server's side (the database's) answers 503 with an error id (``futures.internal_error``),
never its text.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel as PydanticModel
from safetensors.torch import save_file
from sqlalchemy import delete, func, select
from starlette.concurrency import run_in_threadpool
from tinker import types

from openrft.service.store.base import now_s
from openrft.service.store.models import Checkpoint, Event, Job
from openrft.service.tinker import checks
from openrft.service.tinker.checkpoints import (
    ALL_KINDS,
    EXTERNAL,
    MODEL_ID,
    NAME,
    CheckpointError,
    Location,
    parse_any,
)
from openrft.service.tinker.futures import internal_error
from openrft.service.tinker.records import API
from openrft.service.tinker.routes import (
    USER_ERRORS,
    _model,
    check_name_or_400,
    dump,
    expiry,
    owner,
    quota,
    read_body,
    state,
)

router = APIRouter(prefix="/api/v1", include_in_schema=False, dependencies=[Depends(owner)])
downloads = APIRouter(prefix="/api/v1", include_in_schema=False)  # signed URLs: no API key
MAX_PAGE = 1000
URL_LIFETIME_S = 3600
SIGNING_KEY = secrets.token_bytes(32)  # per server process: its URLs end with it


def _page(limit: int, offset: int) -> tuple[int, int]:
    if not 1 <= limit <= MAX_PAGE:
        raise HTTPException(400, f"limit {checks.shown(limit)} must be in [1, {MAX_PAGE}]")
    if offset < 0:
        raise HTTPException(400, f"offset {checks.shown(offset)} must be 0 or more")
    return limit, offset


def _scope(access_scope: str) -> None:
    if access_scope not in ("owned", "accessible"):
        raise HTTPException(400, f"access_scope {checks.shown(access_scope)} must be 'owned' or 'accessible'")


async def _stored(what: str, work, *args):
    """``work(*args)`` on a thread (it queries the job store); a failure answers 503 with an error id."""
    try:
        return await run_in_threadpool(work, *args)
    except HTTPException:
        raise
    except Exception as exc:
        raise HTTPException(503, internal_error(exc, what)) from None


def _when(seconds: float | None) -> datetime:
    return datetime.fromtimestamp(seconds or 0, UTC)


def _checkpoint(loc: Location, meta: dict, size: int) -> types.Checkpoint:
    expires = meta.get("expires_at")
    return types.Checkpoint(
        checkpoint_id=f"{loc.kind}/{loc.name}",
        checkpoint_type=ALL_KINDS[loc.kind],
        time=_when(meta.get("time")),
        tinker_path=loc.tinker_path,
        size_bytes=size,
        public=bool(meta.get("public")),
        user_metadata=meta.get("user_metadata") or None,
        expires_at=None if expires is None else _when(expires),
    )


def _location(model_id: str, kind: str, name: str) -> Location:
    if not MODEL_ID.match(model_id) or kind not in ALL_KINDS or not NAME.match(name):
        raise HTTPException(404, f"no checkpoint {checks.shown(f'tinker://{model_id}/{kind}/{name}')}")
    return Location(model_id, kind, name)


# training runs -----------------------------------------------------------------------------------


def _runs(st, who: str, model_id: str | None = None, limit: int | None = None, offset: int = 0):
    """The tenant's training runs (job rows, newest first) and how many there are."""
    where = [Job.api == API, Job.owner == who]
    if model_id is not None:
        where.append(Job.display_name == model_id)
    with st.records.store.session() as s:
        total = s.scalar(select(func.count()).select_from(Job).where(*where))
        query = select(Job).where(*where).order_by(Job.created_at.desc(), Job.seq.desc()).offset(offset)
        jobs = list(s.scalars(query.limit(limit) if limit is not None else query))
        s.expunge_all()
    return jobs, total


def _training_run(st, who: str, job: Job) -> types.TrainingRun:
    model_id = job.display_name
    found = st.checkpoints.list(model_id, who)
    newest = {kind: item for item in found for kind in [item[0].kind]}  # oldest first: the last one stays
    lora = (job.request or {}).get("lora_config") or {}
    last = max([job.updated_at or 0, job.created_at or 0] + [meta.get("time", 0) for _, meta, _ in found])
    return types.TrainingRun(
        training_run_id=model_id,
        base_model=job.model,
        model_owner=who,
        is_lora=True,
        lora_rank=lora.get("rank"),
        last_request_time=_when(last),
        last_checkpoint=_checkpoint(*newest["weights"]) if "weights" in newest else None,
        last_sampler_checkpoint=_checkpoint(*newest["sampler_weights"]) if "sampler_weights" in newest else None,
        user_metadata=job.user_metadata or None,
    )


def _one_run(st, who: str, model_id: str) -> types.TrainingRun:
    jobs, _ = _runs(st, who, model_id=model_id, limit=1) if MODEL_ID.match(model_id) else ([], 0)
    if not jobs:
        raise HTTPException(404, f"no training run {checks.shown(model_id)}")
    return _training_run(st, who, jobs[0])


@router.get("/training_runs")
async def list_training_runs(
    request: Request,
    limit: int = 20,
    offset: int = 0,
    access_scope: str = "owned",
    project_id: str | None = None,
    who: str = Depends(owner),
) -> dict:
    _scope(access_scope)
    limit, offset = _page(limit, offset)
    if project_id is not None:
        raise HTTPException(400, f"project_id {checks.shown(project_id)}: this server has no projects")
    st = state(request)

    def work() -> types.TrainingRunsResponse:
        jobs, total = _runs(st, who, limit=limit, offset=offset)
        runs = [_training_run(st, who, job) for job in jobs]
        return types.TrainingRunsResponse(
            training_runs=runs, cursor=types.Cursor(offset=offset, limit=limit, total_count=total)
        )

    return dump(await _stored("listing training runs", work))


@router.get("/training_runs/{model_id}")
async def get_training_run(model_id: str, request: Request, access_scope: str = "owned", who: str = Depends(owner)):
    _scope(access_scope)
    return dump(await _stored("reading a training run", _one_run, state(request), who, model_id))


@router.get("/training_runs/{model_id}/checkpoints")
async def list_checkpoints(model_id: str, request: Request, who: str = Depends(owner)) -> dict:
    st = state(request)

    def work() -> types.CheckpointsListResponse:
        found = st.checkpoints.list(model_id, who) if MODEL_ID.match(model_id) else []
        if not found:
            _one_run(st, who, model_id)  # a run with no checkpoint is an empty list; another tenant's, not found
        return types.CheckpointsListResponse(checkpoints=[_checkpoint(*item) for item in found])

    return dump(await _stored("listing checkpoints", work))


@router.get("/checkpoints")
async def list_user_checkpoints(request: Request, limit: int = 100, offset: int = 0, who: str = Depends(owner)):
    limit, offset = _page(limit, offset)
    st = state(request)

    def work() -> types.CheckpointsListResponse:
        found = [item for model_id in st.checkpoints.model_ids() for item in st.checkpoints.list(model_id, who)]
        found.sort(key=lambda item: (item[1].get("time", 0), item[0].tinker_path), reverse=True)  # newest first
        page = [_checkpoint(*item) for item in found[offset : offset + limit]]
        cursor = types.Cursor(offset=offset, limit=limit, total_count=len(found))
        return types.CheckpointsListResponse(checkpoints=page, cursor=cursor)

    return dump(await _stored("listing checkpoints", work))


# checkpoints: delete, publish, ttl ---------------------------------------------------------------


@router.delete("/training_runs/{model_id}/checkpoints/{kind}/{name}")
async def delete_checkpoint(model_id: str, kind: str, name: str, request: Request, who: str = Depends(owner)):
    st = state(request)
    loc = _location(model_id, kind, name)

    def work() -> None:
        try:
            moved = st.checkpoints.detach(loc, who)  # out of reach at once
        except CheckpointError as exc:
            raise HTTPException(404, str(exc)) from None
        try:
            with st.records.store.session() as s:
                jobs = select(Job.id).where(Job.api == API, Job.owner == who, Job.display_name == model_id)
                job_ids = list(s.scalars(jobs))
                s.execute(delete(Checkpoint).where(Checkpoint.job_id.in_(job_ids), Checkpoint.path == loc.tinker_path))
                for job_id in job_ids[:1]:
                    s.add(
                        Event(
                            job_id=job_id,
                            created_at=now_s(),
                            level="info",
                            type="message",
                            message=f"Deleted {loc.tinker_path}",
                            data={},
                        )
                    )
        except BaseException:
            st.checkpoints.restore(loc, moved)  # nothing changed
            raise
        st.checkpoints.purge(moved)

    await _stored(f"deleting {loc.tinker_path}", work)
    return Response(status_code=204)


async def _update(request: Request, who: str, loc: Location, **fields) -> Response:
    st = state(request)

    def work() -> None:
        try:
            st.checkpoints.update(loc, who, **fields)
        except CheckpointError as exc:
            raise HTTPException(404, str(exc)) from None

    await _stored(f"changing {loc.tinker_path}", work)
    return Response(status_code=204)


@router.post("/training_runs/{model_id}/checkpoints/{kind}/{name}/publish")
async def publish(model_id: str, kind: str, name: str, request: Request, who: str = Depends(owner)):
    return await _update(request, who, _location(model_id, kind, name), public=True)


@router.delete("/training_runs/{model_id}/checkpoints/{kind}/{name}/publish")
async def unpublish(model_id: str, kind: str, name: str, request: Request, who: str = Depends(owner)):
    return await _update(request, who, _location(model_id, kind, name), public=False)


@router.put("/training_runs/{model_id}/checkpoints/{kind}/{name}/ttl")
async def set_ttl(model_id: str, kind: str, name: str, request: Request, who: str = Depends(owner)):
    loc = _location(model_id, kind, name)
    body = await read_body(request, _TtlBody)
    return await _update(request, who, loc, expires_at=expiry(body.ttl_seconds))


class _TtlBody(PydanticModel):
    ttl_seconds: int | None = None


@router.post("/weights_info")
async def weights_info(request: Request, who: str = Depends(owner)) -> dict:
    body = await read_body(request, _WeightsInfoBody)
    st = state(request)
    try:
        loc = parse_any(body.tinker_path)
        meta = st.checkpoints.meta(loc, who)
    except CheckpointError as exc:
        raise HTTPException(404 if "no checkpoint" in str(exc) else 400, str(exc)) from None
    lora = meta.get("lora") or {}
    return dump(
        types.WeightsInfoResponse(
            base_model=meta["base_model"],
            is_lora=True,
            lora_rank=lora.get("rank"),
            train_unembed=lora.get("train_unembed"),
            train_mlp=lora.get("train_mlp"),
            train_attn=lora.get("train_attn"),
        )
    )


class _WeightsInfoBody(PydanticModel):
    tinker_path: str


# sessions ----------------------------------------------------------------------------------------


def _sessions(st, who: str) -> list[str]:
    """The tenant's sessions, newest first: those of its training runs (from the store) and the live ones."""
    jobs, _ = _runs(st, who)
    seen: dict[str, None] = {}
    for session_id, owner_ in reversed(list(st.sessions.items())):  # created in order: newest last
        if owner_ == who:
            seen[session_id] = None
    for job in jobs:
        session_id, _, _ = (job.display_name or "").partition(":train:")
        if session_id:
            seen.setdefault(session_id, None)
    return list(seen)


@router.get("/sessions")
async def list_sessions(
    request: Request, limit: int = 20, offset: int = 0, access_scope: str = "owned", who: str = Depends(owner)
) -> dict:
    _scope(access_scope)
    limit, offset = _page(limit, offset)
    found = await _stored("listing sessions", _sessions, state(request), who)
    return dump(types.ListSessionsResponse(sessions=found[offset : offset + limit]))


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, request: Request, access_scope: str = "owned", who: str = Depends(owner)):
    _scope(access_scope)
    st = state(request)

    def work() -> types.GetSessionResponse:
        jobs, _ = _runs(st, who)
        runs = [job.display_name for job in reversed(jobs) if (job.display_name or "").startswith(session_id + ":")]
        if not runs and st.sessions.get(session_id) != who:
            raise HTTPException(404, f"no session {checks.shown(session_id)}")
        made_in = getattr(st, "sampler_sessions", {})  # sampling session id -> the SDK session that made it

        def of_session(sampler_id: str, sampler) -> bool:
            snapshot_of = sampler.model.model_id if sampler.model is not None else None
            return sampler.owner == who and (snapshot_of in runs or made_in.get(sampler_id) == session_id)

        samplers = [sid for sid, sampler in list(st.engine.samplers.items()) if of_session(sid, sampler)]
        return types.GetSessionResponse(training_run_ids=runs, sampler_ids=samplers)

    return dump(await _stored("reading a session", work))


# external weights and their download -------------------------------------------------------------


@router.post("/save_weights_external")
async def save_weights_external(request: Request, who: str = Depends(owner)) -> dict:
    body = await read_body(request, types.SaveWeightsExternalRequest)
    if body.age_encryption_recipients:
        raise HTTPException(400, "age_encryption_recipients: encrypted exports are not served by this server")
    st = state(request)
    model = _model(st, who, body.model_id)
    check_name_or_400(body.path)
    expires = expiry(body.ttl_seconds)
    loc = Location(model.model_id, EXTERNAL, body.path)
    await quota(st, who, model.adapter_bytes)  # counted with the key's files and other checkpoints (413)

    def work() -> dict:
        adapter = st.engine.adapter_state(model)
        config = st.engine.peft_config(model)
        config.base_model_name_or_path = model.base.name

        def fill(folder) -> None:
            save_file({k: v.contiguous() for k, v in adapter.items()}, str(folder / "adapter_model.safetensors"))
            config.save_pretrained(str(folder))

        meta = {"base_model": model.base.name, "steps": model.steps, "lora": model.lora.__dict__}
        st.checkpoints.write(loc, who, {**meta, "expires_at": expires}, fill)
        st.records.checkpoint(model.job_id, model.steps, loc.tinker_path, "external weights")
        size = st.checkpoints.size(loc)
        return dump(types.SaveWeightsExternalResponseInternal(path=loc.tinker_path, size_bytes=size))

    return {"request_id": st.futures.submit(who, work, USER_ERRORS, host=st.engine.host_of(model))}


def _sign(payload: dict) -> str:
    raw = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode().rstrip("=")
    mac = hmac.new(SIGNING_KEY, raw.encode(), hashlib.sha256).hexdigest()
    return f"{raw}.{mac}"


def _verify(token: str) -> dict:
    raw, _, mac = token.partition(".")
    expected = hmac.new(SIGNING_KEY, raw.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac.encode(), expected.encode()):
        raise HTTPException(404, "no such download (a URL this server did not sign, or signed before it restarted)")
    payload = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    if payload["e"] < time.time():
        raise HTTPException(404, "this download URL has expired: ask get_external_weights_urls for a new one")
    return payload


@router.get("/training_runs/{model_id}/checkpoints/{kind}/{name}/external_weights_urls")
async def external_weights_urls(model_id: str, kind: str, name: str, request: Request, who: str = Depends(owner)):
    loc = _location(model_id, kind, name)
    if loc.kind != EXTERNAL:
        shown = checks.shown(loc.tinker_path)
        raise HTTPException(400, f"{shown} is not external weights: save them with save_weights_external")
    st = state(request)
    try:
        st.checkpoints.meta(loc, who)
    except CheckpointError as exc:
        raise HTTPException(404, str(exc)) from None
    expires = int(time.time()) + URL_LIFETIME_S
    base = str(request.base_url).rstrip("/")
    urls = {
        file: f"{base}/api/v1/checkpoint_files/{_sign({'o': who, 'p': loc.tinker_path, 'f': file, 'e': expires})}"
        for file in st.checkpoints.files(loc)
    }
    return dump(types.ExternalWeightsUrlsResponse(urls=urls, expires=_when(expires)))


@downloads.get("/checkpoint_files/{token}")
async def download(token: str, request: Request) -> FileResponse:
    payload = _verify(token)
    st = state(request)
    try:
        loc = parse_any(payload["p"])
        st.checkpoints.meta(loc, payload["o"])
    except CheckpointError:
        raise HTTPException(404, "no such download: the checkpoint was deleted or has expired") from None
    path = st.checkpoints.files(loc).get(payload["f"])
    if path is None:
        raise HTTPException(404, "no such download: the checkpoint was deleted or has expired")
    return FileResponse(path, filename=path.name)
