"""The Tinker API (``/api/v1/...``) as the official ``tinker`` SDK calls it: the SDK's own request and
response models (``tinker.types``) read and write every JSON body, its protobuf module the binary ones.

Authentication: the SDK sends its api_key as ``X-API-Key``; the key is an OpenRFT key (``openrft keys
create``), given to the SDK with the ``tml-`` prefix the SDK insists on (``tml-ork-...``), and each key is
its own tenant: models, samplers, futures and checkpoints of another key read as not found.
Errors: a request that cannot be read, or asks past the operator's bounds or for a model the operator did
not publish (``checks.py``), answers 400/404/413 ``{"detail": ...}`` naming the field, before any work; one
that fails while it runs resolves its future to ``{"error": ..., "category": "user" | "server"}`` (the SDK
raises RequestFailedError). A server-side failure (the database's, a library's) is logged with an error id
and answered with that id, never with the exception's text (``futures.internal_error``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from tinker import types

from openrft.algo.tinker_losses import LossInputError
from openrft.errors import ModelNotFoundError, OpenRFTError
from openrft.service.auth import RecentOwners
from openrft.service.errors import ApiError
from openrft.service.quotas import quota_error
from openrft.service.tenancy import is_operator
from openrft.service.tinker import checks
from openrft.service.tinker.backends import engine_for
from openrft.service.tinker.checkpoints import (
    CheckpointError,
    CheckpointStore,
    Location,
    check_name,
    parse,
)
from openrft.service.tinker.engine import DEFAULT_MAX_TOKENS, LoraSettings, UserError
from openrft.service.tinker.futures import Failure, Futures, Queued, internal_error
from openrft.service.tinker.holdings import holdings
from openrft.service.tinker.metering import Meter
from openrft.service.tinker.records import SessionRecords
from openrft.service.tinker.settings import TinkerSettings
from openrft.service.tinker.wire import WireError, forward_backward_output, read_forward_backward, sample_response

log = logging.getLogger("openrft.tinker")
PROTO = "application/x-protobuf"
USER_ERRORS = (UserError, LossInputError, CheckpointError, ModelNotFoundError, WireError)
SDK_KEY_PREFIX = "tml-"
TTL_RANGE = (3600, 10 * 365 * 86400)  # a checkpoint's ttl_seconds, as the SDK documents it: 1 hour to 10 years


class TinkerState:
    def __init__(
        self,
        data_dir,
        store,
        auth,
        settings: TinkerSettings | None = None,
        max_stored_bytes: int | None = None,
        ray_address: str | None = None,
    ) -> None:
        self.settings = settings or TinkerSettings()
        self.owners = RecentOwners(auth)
        self.engine = engine_for(checks.published(self.settings), self.settings, ray_address)
        self.futures = Futures(self.settings.schedule, self.settings.abandon_s)
        self.meter = Meter(store, self.engine.resources_of)  # calls' time in their tenants' quotas
        self.futures.on_ran = self.meter.ran
        self.on_cluster = bool(ray_address)
        self.checkpoints = CheckpointStore(data_dir / "tinker")
        self.records = SessionRecords(store)
        self.store, self.max_stored_bytes = store, max_stored_bytes  # a tenant's files and checkpoints together
        self.sessions: dict[str, str] = {}  # session id -> owner
        self.creating: dict[str, str] = {}  # training clients queued to be made: model id -> owner
        self.sampler_sessions: dict[str, str] = {}  # sampling session id -> its SDK session
        self.sampling: dict[str, int] = {}  # owner -> sampling sessions being made

    def holdings(self, who: str) -> dict:
        """The Tinker hosts and the clients each holds, as ``who`` may see them (the dashboard's cluster view)."""
        return holdings(self.engine, who, self.on_cluster)

    def room(self, who: str) -> int | None:
        """The bytes ``who``'s Tinker checkpoints may take: the storage quota less its files (None: no cap)."""
        if self.max_stored_bytes is None or is_operator(who):
            return None
        return self.max_stored_bytes - self.store.stored_bytes(who)

    def training_clients(self, who: str) -> int:
        made = {m.model_id for m in list(self.engine.models.values()) if m.owner == who}
        return len(made | {m for m, owner in list(self.creating.items()) if owner == who})

    def sampling_sessions(self, who: str) -> int:
        samplers = list(self.engine.samplers.values())
        made = sum(1 for s in samplers if s.owner == who and s.sampler_id in self.sampler_sessions)
        return made + self.sampling.get(who, 0)


def session_of(model_id: str) -> str:
    """The SDK session a training client belongs to (its id is ``SESSION:train:SEQ``)."""
    return model_id.split(":", 1)[0]


def cap(st: TinkerState, who: str, what: str, count: int) -> None:
    """400 when ``who`` already has as many ``what`` as the operator's cap allows (not 429: the SDK retries
    that for minutes, and waiting frees nothing; finishing a session does)."""
    name = f"max_{what.replace(' ', '_')}"
    if count >= getattr(st.settings, name):
        raise HTTPException(
            400,
            f"{what}: this API key has {count}, the most {st.settings.bound(name)} allows; finish a session "
            "(the SDK does when its ServiceClient is closed or garbage-collected) to free its clients",
        )


async def quota(st: TinkerState, who: str, need: int) -> None:
    """413 before a save is queued when ``who``'s files and checkpoints with the ``need`` bytes of this one
    would pass its storage quota (the worker checks the exact size again before it keeps the save)."""

    def used() -> tuple[int | None, int]:
        return st.room(who), st.checkpoints.owner_bytes(who)

    room, stored = await run_in_threadpool(used)
    if room is not None and stored + need > room:
        files = st.max_stored_bytes - room
        raise HTTPException(
            413,
            f"storage quota: this API key stores {files:,} bytes in files and {stored:,} in Tinker checkpoints; "
            f"this one's ~{need:,} bytes would pass the service's limit of {st.max_stored_bytes:,} bytes per API "
            "key (--max-stored-mb); delete files to make room",
        )


async def owner(request: Request) -> str:
    key = request.headers.get("x-api-key") or ""
    if key.startswith(SDK_KEY_PREFIX):
        key = key[len(SDK_KEY_PREFIX) :]
    credential = f"Bearer {key}" if key else None
    owners = state(request).owners
    who = owners.cached(credential)
    if who is not None:
        return who
    try:
        return await run_in_threadpool(owners.owner, credential)
    except ApiError as exc:
        raise HTTPException(exc.status, exc.message) from None


def state(request: Request) -> TinkerState:
    return request.app.state.tinker


async def json_body(request: Request) -> Any:
    """The request's JSON document; 400 when the body is not one (never the parser's traceback)."""
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, an integer of over 4300 digits, nested too deep
        raise HTTPException(400, f"body: not a JSON document ({len(raw)} bytes)") from None


def read(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise HTTPException(400, f"{where}: {first['msg']} (got {checks.shown(first.get('input'))})") from None
    except (ValueError, TypeError, RecursionError, AssertionError):  # a validator of the SDK's types
        raise HTTPException(400, f"body: not a valid {model.__name__}") from None


async def read_body(request: Request, model: type[BaseModel]) -> Any:
    return read(model, await json_body(request))


def refused(exc: checks.Refused | WireError) -> HTTPException:
    return HTTPException(exc.status, str(exc))


def dump(value: BaseModel) -> dict:
    return value.model_dump(mode="json", exclude_none=True)


router = APIRouter(prefix="/api/v1", include_in_schema=False, dependencies=[Depends(owner)])


async def within_quota(st: TinkerState, who: str) -> None:
    """429 ``insufficient_quota`` naming the quota, as the job routes answer, for a new call of a tenant whose
    use reached its quota (metering.py); ``x-should-retry: false`` for clients that read it (the SDK's training
    calls retry a 429 for up to 5 minutes whatever it says: docs/scaling.md)."""
    why = await run_in_threadpool(st.meter.refusal, who)
    if why is not None:
        raise quota_error(why, "Tinker calls are refused", {"x-should-retry": "false"})


def _future(st: TinkerState, who: str, work, session: str | None = None, host: str = "", **extra) -> dict:
    """``work`` queued on ``host``'s worker (where the client computes: ``engine.host_of``) in ``who``'s turn."""
    return {"request_id": st.futures.submit(who, work, USER_ERRORS, session, host), **extra}


@contextmanager
def loading(who: str) -> Iterator[None]:
    """Loading a base model for ``who``: a tenant's names are published ones, so a model that cannot be found
    is the operator's to fix and fails as the server's (an error id, no path); the local operator's own path
    or Hub id fails with its message, as a user error."""
    try:
        yield
    except (ModelNotFoundError, OpenRFTError) as exc:
        if is_operator(who):
            raise
        raise RuntimeError("a published base model could not be loaded") from exc


def _new_model_id(st: TinkerState, who: str, session_id: str, seq_id: int) -> str:
    """The id the SDK derives itself for a model created from a checkpoint: ``SESSION:train:SEQ``."""
    if st.sessions.get(session_id) != who:
        raise HTTPException(404, f"no session {checks.shown(session_id)}")
    if not 0 <= seq_id < 2**31:
        raise HTTPException(400, f"model_seq_id {checks.shown(seq_id)} must be in [0, 2**31)")
    model_id = f"{session_id}:train:{seq_id}"
    if model_id in st.engine.models:
        raise HTTPException(400, f"model {model_id!r} exists")
    return model_id


METADATA_BOUNDS = (64, 128, 1024)  # a training run's user_metadata: entries, characters of a key, of a value


def run_metadata(metadata: dict | None) -> dict[str, str] | None:
    """A training run's ``user_metadata`` as the SDK's ``TrainingRun`` lists it (string keys and values, bounded);
    anything else is refused naming the entry."""
    if not metadata:
        return None
    entries, key_chars, value_chars = METADATA_BOUNDS
    if len(metadata) > entries:
        raise HTTPException(400, f"user_metadata holds {len(metadata)} entries; at most {entries}")
    for key, value in metadata.items():
        if not isinstance(value, str) or not 1 <= len(key) <= key_chars or len(value) > value_chars:
            raise HTTPException(
                400,
                f"user_metadata[{checks.shown(key)}] = {checks.shown(value)}: keys of 1 to {key_chars} characters, "
                f"values strings of at most {value_chars}",
            )
    return dict(metadata)


def _model(st: TinkerState, who: str, model_id: str):
    model = st.engine.models.get(model_id)
    if model is None or model.owner != who:
        shown = checks.shown(model_id)
        raise HTTPException(404, f"no training model {shown} (create it with create_lora_training_client)")
    return model


# session and handshake ---------------------------------------------------------------------------


@router.post("/client/config")
async def client_config() -> dict:
    return dump(
        types.ClientConfigResponse(
            pjwt_auth_enabled=False,
            use_pyqwest_transport=True,  # the SDK's default: its client spends about half the CPU of httpx's
            proto_compress_fwdbwd=False,
            sample_use_retrieve_futures=False,
            custom_loss_server_side=False,
            sample_join_sampling_session=False,
        )
    )


@router.post("/client/dynamic_config")
async def client_dynamic_config() -> dict:
    # the SDK then sends cancel_future for a sample future it abandons (a timeout, a cancelled task)
    return dump(types.ClientDynamicConfigResponse(sample_cancel_enabled=True))


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/get_server_capabilities")
async def capabilities(request: Request) -> dict:
    names = checks.published(state(request).settings)
    models = [types.SupportedModel(model_name=name, trainable=True, sampleable=True) for name in sorted(names)]
    return dump(types.GetServerCapabilitiesResponse(supported_models=models))


@router.post("/create_session")
async def create_session(request: Request, who: str = Depends(owner)) -> dict:
    await read_body(request, types.CreateSessionRequest)
    session_id = "sess_" + uuid.uuid4().hex
    st = state(request)
    st.sessions[session_id] = who
    st.futures.beat(session_id)
    return dump(types.CreateSessionResponse(session_id=session_id))


@router.post("/session_heartbeat")
async def heartbeat(request: Request, who: str = Depends(owner)) -> dict:
    """The SDK's heartbeat, every 10 s while its ServiceClient lives: a session silent for
    ``--tinker-abandon-after-s`` is a client gone, its queued calls dropped (futures.py)."""
    body = await read_body(request, types.SessionHeartbeatRequest)
    st = state(request)
    if st.sessions.get(body.session_id) == who:
        st.futures.beat(body.session_id)
    return {"type": "session_heartbeat"}


@router.post("/sessions/{session_id}/finish")
async def finish(session_id: str, request: Request, who: str = Depends(owner)) -> dict:
    st = state(request)
    if st.sessions.get(session_id) == who:
        st.sessions.pop(session_id)
        st.futures.drop_session(session_id, f"session {session_id} finished")
        st.futures.forget_session(session_id)
        for model in list(st.engine.models.values()):
            if model.owner == who and model.model_id.startswith(session_id + ":") and model.job_id:
                st.records.ended(model.job_id, "succeeded", f"Session {session_id} finished at step {model.steps}")

        def free() -> None:  # on the worker, after the call it may be running: its clients leave memory
            for model_id in [m for m in list(st.engine.models) if session_of(m) == session_id]:
                st.engine.free_model(model_id)
            for sampler_id in [s for s, sess in list(st.sampler_sessions.items()) if sess == session_id]:
                st.engine.forget_sampler(sampler_id)
                st.sampler_sessions.pop(sampler_id, None)

        st.futures.call(who, free)
    return {}


@router.post("/telemetry")
async def telemetry() -> dict:
    return {"status": "accepted"}


@router.post("/cancel_future")
async def cancel_future(request: Request, who: str = Depends(owner)) -> dict:
    """A queued call is dropped; a running ``forward_backward`` stops at its next chunk (its gradients as
    before the call); a call already done, or one that cannot stop (a sample in its decode batch), is left."""
    body = await json_body(request)
    request_id = body.get("request_id") if isinstance(body, dict) else None
    if not isinstance(request_id, str):
        raise HTTPException(400, f"request_id: expected a request id string, got {checks.shown(request_id)}")
    outcome = state(request).futures.cancel(request_id, who)
    if outcome is None:
        raise HTTPException(404, f"no request {checks.shown(request_id)}")
    return {"request_id": request_id, "cancel": outcome}


# training ----------------------------------------------------------------------------------------


@router.post("/create_model")
async def create_model(request: Request, who: str = Depends(owner)) -> dict:
    await within_quota(state(request), who)
    body = await read_body(request, types.CreateModelRequest)
    if body.lora_config is None:
        raise HTTPException(400, "lora_config: full fine-tuning is not served; create a LoRA training client")
    if not 1 <= body.lora_config.rank <= 256:
        raise HTTPException(400, f"lora_config.rank must be in [1, 256], got {checks.shown(body.lora_config.rank)}")
    if getattr(body.optimizer_config, "type", "adamw") != "adamw":
        shown = checks.shown(body.optimizer_config.type)
        raise HTTPException(400, f"optimizer_config.type {shown}: only 'adamw' is served")
    st = state(request)
    try:
        checks.lora(body.lora_config)
        checks.base_model(st.settings, who, body.base_model)
    except checks.Refused as exc:
        raise refused(exc) from None
    model_id = _new_model_id(st, who, body.session_id, body.model_seq_id)
    cap(st, who, "training clients", st.training_clients(who))
    metadata = run_metadata(body.user_metadata)
    lora = LoraSettings(
        **body.lora_config.model_dump(include={"rank", "seed", "train_mlp", "train_attn", "train_unembed"})
    )

    host = placed(st, model_id, who)

    def work() -> dict:
        with loading(who):
            model = st.engine.create_model(model_id, who, body.base_model, lora)
        model.job_id = st.records.started(who, model_id, model.base.name, lora.__dict__, user_metadata=metadata)
        return dump(types.CreateModelResponse(model_id=model_id))

    return _creating(st, who, model_id, work, host, model_id=model_id)


def placed(st: TinkerState, client_id: str, who: str) -> str:
    """The host a new training client or sampler will run on (503 naming the bound when every one is full)."""
    try:
        return st.engine.place(client_id, who)
    except UserError as exc:
        raise HTTPException(503, str(exc)) from None


def _creating(st: TinkerState, who: str, new_id: str, work, host: str, **extra) -> dict:
    """A call that makes training client ``new_id``: counted in its owner's cap from now on."""
    st.creating[new_id] = who
    answer = _future(st, who, work, session_of(new_id), host, **extra)
    st.futures.get(answer["request_id"], who).future.add_done_callback(lambda _: st.creating.pop(new_id, None))
    return answer


@router.post("/get_info")
async def get_info(request: Request, who: str = Depends(owner)) -> dict:
    body = await read_body(request, types.GetInfoRequest)
    model = _model(state(request), who, body.model_id)
    data = types.ModelData(
        # the model's directory: the SDK's get_tokenizer() loads from it (offline, docs/tinker.md)
        arch=model.base.arch,
        model_name=model.base.path,
        tokenizer_id=model.base.path,
    )
    return dump(
        types.GetInfoResponse(
            model_data=data,
            model_id=model.model_id,
            is_lora=True,
            lora_rank=model.lora.rank,
            model_name=model.base.name,
        )
    )


@router.post("/forward_backward")
async def forward_backward(request: Request, who: str = Depends(owner)) -> dict:
    await within_quota(state(request), who)
    st = state(request)
    try:
        msg = read_forward_backward(await request.body(), st.settings)
    except WireError as exc:
        raise refused(exc) from None
    model = _model(st, who, msg.model_id)

    def work():  # in chunks, other tenants' calls between them (futures.py)
        outputs, metrics = yield from st.engine.forward_backward_steps(
            model, msg.loss_fn, msg.loss_fn_config, msg.data, not msg.forward_only
        )
        return forward_backward_output(outputs, metrics)

    host = st.engine.host_of(model)
    return _future(st, who, work, session_of(model.model_id), host, model_id=msg.model_id)


@router.post("/optim_step")
async def optim_step(request: Request, who: str = Depends(owner)) -> dict:
    await within_quota(state(request), who)
    body = await read_body(request, types.OptimStepRequest)
    if not isinstance(body.optim_params, types.AdamParams):
        raise HTTPException(400, f"optim_params: only AdamParams are served, got {type(body.optim_params).__name__}")
    try:
        checks.adam(body.optim_params)  # before the model is looked at: nothing changes on a refusal
    except checks.Refused as exc:
        raise refused(exc) from None
    st = state(request)
    model = _model(st, who, body.model_id)

    def work() -> dict:
        metrics = st.engine.optim_step(model, body.optim_params)
        row = {**st.engine.take_pending(model), **metrics, "optim/learning_rate": body.optim_params.learning_rate}
        row.update(st.engine.threads_metrics())  # perf/threads_generate, perf/threads_learn: as a job's rows
        st.records.step(model.job_id, model.steps, row)
        st.meter.flush_soon()  # the step's use shows with it
        return dump(types.OptimStepResponse(metrics=metrics))

    return _future(st, who, work, session_of(model.model_id), st.engine.host_of(model))


@router.post("/save_weights")
async def save_weights(request: Request, who: str = Depends(owner)) -> dict:
    await within_quota(state(request), who)
    body = await read_body(request, types.SaveWeightsRequest)
    st = state(request)
    model = _model(st, who, body.model_id)
    name = body.path or f"step-{model.steps:06d}"
    check_name_or_400(name)
    loc = Location(model.model_id, "weights", name)
    kept = {"expires_at": expiry(body.ttl_seconds), "user_metadata": body.user_metadata}
    await quota(st, who, model.adapter_bytes * (3 if st.engine.has_moments(model) else 1))  # and AdamW's moments

    def work() -> dict:
        meta = _meta(model, **kept)
        tensors = {"adapter": st.engine.adapter_state(model), "optimizer": st.engine.optimizer_state(model)}
        st.checkpoints.save(loc, who, meta, tensors, overwrite=body.overwrite, room=st.room(who))
        st.records.checkpoint(model.job_id, model.steps, loc.tinker_path, "state")
        return dump(types.SaveWeightsResponse(path=loc.tinker_path))

    return _future(st, who, work, session_of(model.model_id), st.engine.host_of(model))


def _meta(model, **kept) -> dict:
    lora = model.lora
    return {"base_model": model.base.name, "steps": model.steps, "lora": lora.__dict__, **kept}


def expiry(ttl_seconds: Any) -> float | None:
    """When a checkpoint saved with ``ttl_seconds`` expires (None: never); out of the SDK's range is refused."""
    if ttl_seconds is None:
        return None
    low, high = TTL_RANGE
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or not low <= ttl_seconds <= high:
        shown = checks.shown(ttl_seconds)
        raise HTTPException(400, f"ttl_seconds {shown} must be an integer in [{low}, {high}] (1 hour to 10 years)")
    return time.time() + ttl_seconds


def check_name_or_400(name: str) -> None:
    try:
        check_name(name)
    except CheckpointError as exc:
        raise HTTPException(400, str(exc)) from None


@router.post("/load_weights")
async def load_weights(request: Request, who: str = Depends(owner)) -> dict:
    await within_quota(state(request), who)
    body = await read_body(request, types.LoadWeightsRequest)
    st = state(request)
    if body.base_model is not None:
        try:
            checks.base_model(st.settings, who, body.base_model)
        except checks.Refused as exc:
            raise refused(exc) from None
    try:
        loc = parse(body.path)
    except CheckpointError as exc:
        raise HTTPException(400, str(exc)) from None
    if loc.kind != "weights":
        shown = checks.shown(body.path)
        raise HTTPException(400, f"path {shown} is sampler weights; load_state needs tinker://MODEL_ID/weights/NAME")
    target = _model(st, who, body.model_id) if body.model_id is not None else None
    if target is None and (body.session_id is None or body.model_seq_id is None):
        raise HTTPException(400, "load_weights needs model_id, or session_id and model_seq_id for a new model")
    new_id = None if target is not None else _new_model_id(st, who, body.session_id, body.model_seq_id)
    metadata = run_metadata(body.user_metadata)
    if new_id is not None:
        cap(st, who, "training clients", st.training_clients(who))

    def work() -> dict:
        meta, tensors = st.checkpoints.load(loc, who)
        model = target
        if body.base_model is not None and st.engine.path_of(body.base_model) != st.engine.path_of(meta["base_model"]):
            raise UserError(
                f"base_model {checks.shown(body.base_model)} is not the base model of {body.path} "
                f"({meta['base_model']}): an override must name the same model"
            )
        if model is None:
            with loading(who):
                model = st.engine.create_model(
                    new_id, who, body.base_model or meta["base_model"], LoraSettings(**meta["lora"])
                )
            model.job_id = st.records.started(
                who, new_id, model.base.name, meta["lora"], source=body.path, user_metadata=metadata
            )
        elif meta["base_model"] != model.base.name or LoraSettings(**meta["lora"]) != model.lora:
            raise UserError(
                f"checkpoint {body.path} is {meta['base_model']} rank {meta['lora']['rank']}: not this model's"
            )
        if body.optimizer:
            st.engine.load_model_state(model, tensors["adapter"], tensors["optimizer"], int(meta["steps"]))
        else:
            st.engine.load_model_state(model, tensors["adapter"], None, None)
        return dump(types.LoadWeightsResponse(path=body.path, model_id=model.model_id))

    if new_id is not None:
        return _creating(st, who, new_id, work, placed(st, new_id, who))
    return _future(st, who, work, session_of(target.model_id), st.engine.host_of(target))


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request, who: str = Depends(owner)) -> dict:
    await within_quota(state(request), who)
    body = await read_body(request, types.SaveWeightsForSamplerRequest)
    st = state(request)
    model = _model(st, who, body.model_id)
    if body.path is not None:
        check_name_or_400(body.path)
        await quota(st, who, model.adapter_bytes)

    kept = {"expires_at": expiry(body.ttl_seconds), "user_metadata": body.user_metadata}

    def work() -> dict:
        if body.path is not None:
            loc = Location(model.model_id, "sampler_weights", body.path)
            adapter = {"adapter": st.engine.adapter_state(model)}
            st.checkpoints.save(loc, who, _meta(model, **kept), adapter, overwrite=True, room=st.room(who))
            st.records.checkpoint(model.job_id, model.steps, loc.tinker_path, "sampler weights")
            return dump(types.SaveWeightsForSamplerResponseInternal(path=loc.tinker_path))
        sampler_id = "smp_" + uuid.uuid4().hex
        st.engine.snapshot_sampler(sampler_id, model)
        return dump(types.SaveWeightsForSamplerResponseInternal(sampling_session_id=sampler_id))

    return _future(st, who, work, session_of(model.model_id), st.engine.host_of(model))


# sampling ----------------------------------------------------------------------------------------


@router.post("/create_sampling_session")
async def create_sampling_session(request: Request, who: str = Depends(owner)) -> dict:
    await within_quota(state(request), who)
    body = await read_body(request, types.CreateSamplingSessionRequest)
    st = state(request)
    sampler_id = "smp_" + uuid.uuid4().hex
    if body.model_path is None and body.base_model is None:
        raise HTTPException(400, "create_sampling_session needs model_path or base_model")
    if body.base_model is not None:
        try:
            checks.base_model(st.settings, who, body.base_model)
        except checks.Refused as exc:
            raise refused(exc) from None
    loc = None
    if body.model_path is not None:
        try:
            loc = parse(body.model_path)
            meta = st.checkpoints.meta(loc, who)
        except CheckpointError as exc:
            raise HTTPException(404 if "no checkpoint" in str(exc) else 400, str(exc)) from None
        base_name = meta["base_model"]
    else:
        base_name = body.base_model
    cap(st, who, "sampling sessions", st.sampling_sessions(who))
    host = placed(st, sampler_id, who)
    st.sampling[who] = st.sampling.get(who, 0) + 1

    def work() -> str:
        if loc is None:
            st.engine.new_sampler(sampler_id, who, base_name, None, None, None)
        else:
            meta, tensors = st.checkpoints.load(loc, who)
            lora = LoraSettings(**meta["lora"])
            st.engine.new_sampler(sampler_id, who, base_name, tensors["adapter"], body.model_path, lora)
        st.sampler_sessions[sampler_id] = body.session_id
        return sampler_id

    # loading a model can take seconds: done on the worker, in its tenant's turn, and waited for here
    future = st.futures.call(who, work, host)
    try:
        await asyncio.wrap_future(future)
    except (ModelNotFoundError, OpenRFTError) as exc:
        if not is_operator(who):  # a published model the server cannot load: the operator's to fix, not shown
            raise HTTPException(503, internal_error(exc, f"loading base_model {checks.shown(base_name)}")) from None
        raise HTTPException(404, f"base_model {checks.shown(base_name)}: {exc}") from None  # their own path
    except CheckpointError as exc:
        raise HTTPException(404, str(exc)) from None
    except Exception as exc:  # a published model the server cannot load, a corrupt checkpoint: 503, an error id
        raise HTTPException(503, internal_error(exc, f"loading base_model {checks.shown(base_name)}")) from None
    finally:
        st.sampling[who] -= 1
    return dump(types.CreateSamplingSessionResponse(sampling_session_id=sampler_id))


def _sampler(st: TinkerState, who: str, sampler_id: str | None):
    sampler = st.engine.samplers.get(sampler_id or "")
    if sampler is None or sampler.owner != who:
        raise HTTPException(404, f"no sampling session {checks.shown(sampler_id)}")
    return sampler


@router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, request: Request, who: str = Depends(owner)) -> dict:
    sampler = _sampler(state(request), who, sampler_id)
    return dump(
        types.GetSamplerResponse(sampler_id=sampler_id, base_model=sampler.base.path, model_path=sampler.model_path)
    )


@router.post("/asample")
async def asample(request: Request, who: str = Depends(owner)) -> dict:
    await within_quota(state(request), who)
    body = await read_body(request, types.SampleRequest)
    st = state(request)
    sampler = _sampler(st, who, body.sampling_session_id)
    try:
        prompt = body.prompt.to_ints()
    except ValueError as exc:
        raise HTTPException(400, f"prompt: {exc}") from None
    unsupported = [
        k for k in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k") if getattr(body, k)
    ] + [k for k in ("target_prompt_logprobs", "prompt_logprobs_last_n") if getattr(body, k) is not None]
    if unsupported:
        raise HTTPException(400, f"{unsupported[0]} is not served by OpenRFT's Tinker API (docs/tinker.md)")

    try:
        checks.sample(st.settings, body.num_samples, len(prompt), body.sampling_params, DEFAULT_MAX_TOKENS)
        st.engine.check_sample(sampler, prompt, body.sampling_params)
    except checks.Refused as exc:
        raise refused(exc) from None
    except UserError as exc:
        raise HTTPException(400, str(exc)) from None
    params = body.sampling_params
    stop = tuple(params.stop) if isinstance(params.stop, list | tuple) else params.stop
    key = (sampler.sampler_id, body.num_samples, bool(body.prompt_logprobs), params.max_tokens, params.temperature)
    key += (params.top_k, params.top_p, stop, params.seed, uuid.uuid4().hex if params.seed is not None else None)

    def run(first: list[Queued], more) -> None:
        def wired(queued: list[Queued]) -> list[Queued]:  # answered as the SDK's SampleResponse message
            return [Queued(q.payload, lambda result, q=q: q.deliver(sample_response(*result))) for q in queued]

        st.engine.sample(
            sampler, body.num_samples, params, bool(body.prompt_logprobs), wired(first), lambda: wired(more())
        )

    session = st.sampler_sessions.get(sampler.sampler_id)
    if sampler.model is not None:
        session = session_of(sampler.model.model_id)
    request_id = st.futures.submit_batched(who, key, prompt, run, USER_ERRORS, session, st.engine.host_of(sampler))
    ids = [f"{request_id}:{i}" for i in range(body.num_samples)]
    if body.record_stability_info:  # stable_reinforce: the sequences recorded under their ids (stability.py)
        record_when_done(st, who, request_id, ids)
    return {"request_id": request_id, "sample_sequence_ids": ids}


def record_when_done(st: TinkerState, who: str, request_id: str, ids: list[str]) -> None:
    def done(future) -> None:
        result = None if future.cancelled() or future.exception() else future.result()
        if isinstance(result, bytes):
            st.engine.stability.record(who, ids, result)

    st.futures.get(request_id, who).future.add_done_callback(done)


# futures -----------------------------------------------------------------------------------------


@router.post("/retrieve_future")
async def retrieve_future(request: Request, who: str = Depends(owner)) -> Response:
    body = await read_body(request, types.FutureRetrieveRequest)
    st = state(request)
    item = st.futures.get(body.request_id, who)
    if item is None:
        raise HTTPException(404, f"no request {checks.shown(body.request_id)}")
    if not await st.futures.wait(item):
        return JSONResponse({"type": "try_again", "request_id": body.request_id, "queue_state": "active"})
    result = item.future.result()
    if isinstance(result, Failure):
        return JSONResponse({"error": result.message, "category": result.category})
    if isinstance(result, bytes):
        return Response(result, media_type=PROTO)
    return JSONResponse(result)


@router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def not_served(path: str) -> None:
    """Every other path under /api/v1: 404 (registered last, so it never hides a route above)."""
    shown = path if len(path) <= 80 else path[:77] + "..."
    raise HTTPException(404, f"/api/v1/{shown} is not a route of this server's Tinker API")
