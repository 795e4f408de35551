"""An OpenAI-compatible generation server with vLLM's LoRA adapter routes, on ``TransformersGenerator``.

Routes: ``GET /v1/models``, ``POST /v1/completions`` (prompts as text or token ids), ``POST
/v1/chat/completions``, and vLLM's ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter``
(an adapter is then served under its name: pass it as ``model``), and OpenRFT's own ``POST
/v1/load_weights`` ``{"path"}``, which replaces the base model's weights with a Hugging Face model
directory's safetensors (full fine-tuning's policy after each update; vLLM has no such route). It is
the server OpenRFT's remote generator speaks to (the same subset of the API as vLLM), and the way to
serve a tuned adapter.

Requests take turns on the model: each generates in chunks of a few sequences, taking the model's lock
per chunk, in arrival order (``server_guard.FairLock``). Authentication, the directories weights load
from and the per-request caps are ``server_guard``'s. Sampled log-probs are those of the temperature-scaled distribution
before top-k/top-p, the quantity the learner recomputes.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import uuid
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from openrft.rollout.local import TransformersGenerator
from openrft.rollout.prompts import openai_history, render_prompt
from openrft.rollout.sampling import scaled_log_probs
from openrft.rollout.server_guard import FairLock, GuardError, ServeLimits, check_stop_ids, key_matches
from openrft.rollout.tool_calls import parse_tool_calls, tool_names
from openrft.rollout.types import Completion, SamplingParams
from openrft.rollout.weight_files import iter_weight_files, weight_files, weight_shapes

MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # like vLLM: fields it does not know are ignored

    model: str | None = None
    n: int = Field(1, ge=1, le=512)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, lt=1)
    seed: int | None = None
    stream: bool | None = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False  # vLLM's: the model's end tokens do not end a completion (stop_token_ids still do)
    best_of: int | None = None


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = False
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # vLLM's: each prompt token's log-prob
    suffix: str | None = None
    return_tokens_as_token_ids: bool | None = None


class ChatRequest(_Request):
    messages: list[dict[str, Any]]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None


class LoadAdapterRequest(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class LoadWeightsRequest(BaseModel):
    path: str = Field(min_length=1)


class UnloadAdapterRequest(BaseModel):
    lora_name: str | None = None
    lora_int_id: int | None = None


class ModelServer:
    """A base model and any number of LoRA adapters loaded by name, generating one request at a time."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        eos_token_ids: list[int],
        served_name: str,
        root: str | None = None,
        max_new_tokens: int = 512,
        seed: int = 0,
        limits: ServeLimits | None = None,
    ):
        self.model, self.tokenizer, self.served_name, self.root = model, tokenizer, served_name, root
        self.limits = limits or ServeLimits()
        self.vocab = int(model.get_input_embeddings().num_embeddings)
        self.eos_token_ids = list(eos_token_ids)
        self.max_new_tokens = max_new_tokens
        self.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.generator = TransformersGenerator(model, tokenizer, self.eos_token_ids, tokenizer.pad_token_id, seed=seed)
        self.adapters: dict[str, tuple[str, str]] = {}  # served name -> (internal name, path)
        self._ids = itertools.count()
        self.lock = FairLock()
        self.created = int(time.time())

    # adapters -----------------------------------------------------------------------------------

    def load_adapter(self, name: str, path: str, trusted: bool = False) -> None:
        """A LoRA adapter served under ``name``; ``trusted`` (the operator's ``--adapter``) skips the load roots."""
        from peft import PeftModel

        if not trusted:
            path = str(self._loadable(path, "lora_path"))
        if name == self.served_name or name in self.adapters:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        internal = f"adapter_{next(self._ids)}"
        with self.lock:
            try:
                if isinstance(self.model, PeftModel):
                    self.model.load_adapter(path, adapter_name=internal)
                else:
                    self.model = PeftModel.from_pretrained(self.model, path, adapter_name=internal)
            except (OSError, ValueError, RuntimeError, KeyError) as exc:
                detail = f": {exc}" if trusted else f" ({type(exc).__name__})"  # a tenant sees no host paths
                message = f"cannot load LoRA adapter '{name}' from lora_path{detail}"
                raise ApiError(400, message, param="lora_path") from None
            self.model.eval()
            self.generator.model = self.model
            self.adapters[name] = (internal, path)

    def unload_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError", "lora_name")
        internal, _ = self.adapters.pop(name)
        with self.lock:
            if self.adapters:
                self.model.delete_adapter(internal)
            else:  # the last adapter: back to the plain base model
                self.model = self.model.unload()
                self.generator.model = self.model

    # full weights ---------------------------------------------------------------------------------

    def load_weights(self, path: str) -> int:
        """Replace the base model's weights with the safetensors files in ``path`` (a Hugging Face model
        directory of the same architecture: what full fine-tuning sends after each update); the count.
        The files' headers are checked first, then the tensors are copied in one at a time."""
        given, path = path, str(self._loadable(path, "path"))
        files = weight_files(Path(path))
        if not files:
            raise ApiError(400, f"no *.safetensors files in {given!r}", param="path")
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        own = base.state_dict()
        shapes = {_base_layer_name(k, own): shape for k, shape in weight_shapes(files).items()}
        unknown = sorted(set(shapes) - set(own))
        wrong = sorted(k for k in shapes if k in own and shapes[k] != tuple(own[k].shape))
        if unknown or wrong:
            raise ApiError(
                400,
                f"the weights in {given!r} do not fit the served model: unknown {unknown[:5]}, "
                f"other shapes {wrong[:5]}",
                param="path",
            )
        with self.lock, torch.no_grad():
            for name, tensor in iter_weight_files(files):
                own[_base_layer_name(name, own)].copy_(tensor)
        self.root = path
        return len(shapes)

    def _loadable(self, path: str, param: str) -> Path:
        try:
            return self.limits.loadable(path, param)
        except GuardError as exc:
            raise ApiError(exc.status, exc.message, "PermissionDeniedError", exc.param) from None

    def models(self) -> dict:
        """The served names; ``root`` is the name too (vLLM shows a host path there; this server shows none)."""
        card = {"object": "model", "created": self.created, "owned_by": "openrft"}
        data = [{"id": self.served_name, **card, "root": self.served_name, "parent": None}]
        data += [{"id": name, **card, "root": name, "parent": self.served_name} for name in self.adapters]
        return {"object": "list", "data": data}

    # generation ---------------------------------------------------------------------------------

    def generate(
        self,
        model_name: str | None,
        prompts: list[list[int]],
        params: SamplingParams,
        seed: int | None,
        stop_token_ids: list[int] | None,
    ) -> list[list[Completion]]:
        name = model_name or self.served_name
        if name != self.served_name and name not in self.adapters:
            raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")
        try:
            self.limits.check_request(prompts, params.n, params.max_new_tokens, self.vocab)
            check_stop_ids(stop_token_ids, self.vocab)
        except GuardError as exc:
            raise ApiError(exc.status, exc.message, param=exc.param) from None
        for prompt in prompts:
            if not prompt:
                raise ApiError(400, "a prompt is empty", param="prompt")
            if self.max_length and len(prompt) + params.max_new_tokens > self.max_length:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {self.max_length} tokens; the prompt "
                    f"({len(prompt)} tokens) plus max_tokens ({params.max_new_tokens}) exceeds it",
                    param="max_tokens",
                )
        rng = self.generator.stream(seed)
        groups: list[list[Completion]] = [[] for _ in prompts]
        for first, count, n in chunks(len(prompts), params, self.limits):  # the lock per chunk: others take turns
            with self.lock:
                if name != self.served_name and name not in self.adapters:  # unloaded meanwhile
                    raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")
                self.generator.model = self.model
                # the request's stop tokens end a completion, the model's own unless ignore_eos
                ends = set(stop_token_ids or []) | (set() if params.ignore_eos else set(self.eos_token_ids))
                self.generator.eos_token_ids = sorted(ends)
                with self._select(name):
                    chunk = prompts[first : first + count]
                    done = self.generator.generate_chunk(chunk, dataclasses.replace(params, n=n, ignore_eos=False), rng)
            for offset, group in enumerate(done):
                groups[first + offset] += group
        return groups

    def _select(self, name: str):
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            return nullcontext()
        if name == self.served_name:
            return self.model.disable_adapter()
        self.model.set_adapter(self.adapters[name][0])
        return nullcontext()

    @torch.no_grad()
    def top_logprobs(
        self, name: str | None, completion: Completion, temperature: float, k: int
    ) -> list[list[tuple[int, float]]]:
        """The ``k`` most likely tokens at each response position (one teacher-forced pass)."""
        if k == 0 or not completion.token_ids:
            return [[] for _ in completion.token_ids]
        ids = torch.tensor([completion.prompt_ids + completion.token_ids], device=self.generator.device)
        with self.lock, self._select(name or self.served_name):
            logits = self.model(input_ids=ids).logits[0, len(completion.prompt_ids) - 1 : -1]
        values, indices = scaled_log_probs(logits, temperature).topk(k, dim=-1)
        return [list(zip(i.tolist(), v.tolist())) for i, v in zip(indices, values)]

    @torch.no_grad()
    def prompt_logprobs(self, name: str | None, prompt: list[int], k: int) -> list[dict[str, dict] | None]:
        """vLLM's ``prompt_logprobs``: for each prompt position after the first, the log-prob of the prompt's
        token there given the ones before (temperature 1, the model's own distribution), with its rank and the
        ``k`` most likely tokens; None for the first. Keys are token ids (JSON object keys, as vLLM's)."""
        ids = torch.tensor([prompt], device=self.generator.device)
        with self.lock, self._select(name or self.served_name):
            logits = self.model(input_ids=ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        targets = torch.tensor(prompt[1:], device=logp.device)
        chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        ranks = (logp > chosen.unsqueeze(-1)).sum(-1) + 1
        tops = logp.topk(k, dim=-1) if k else None
        entries: list[dict[str, dict] | None] = [None]
        for i, token in enumerate(prompt[1:]):
            entry = {}
            if tops is not None:
                for value, index in zip(tops.values[i].tolist(), tops.indices[i].tolist()):
                    entry[str(index)] = {
                        "logprob": value,
                        "rank": len(entry) + 1,
                        "decoded_token": self.tokenizer.decode([index]),
                    }
            entry[str(token)] = {
                "logprob": float(chosen[i]),
                "rank": int(ranks[i]),
                "decoded_token": self.tokenizer.decode([token]),
            }
            entries.append(entry)
        return entries

    def token_text(self, token_id: int, as_id: bool) -> str:
        return f"token_id:{token_id}" if as_id else self.tokenizer.decode([token_id])


def chunks(prompts: int, params: SamplingParams, limits: ServeLimits) -> Iterator[tuple[int, int, int]]:
    """``(first prompt, prompts, samples of each)`` per turn of the lock: at most ``limits.chunk_sequences``
    sequences and ``limits.chunk_tokens`` new tokens (sequences × max_tokens) a turn, a prompt's ``n`` samples
    split over several turns when they are more than that (one prompt × n=4,096 would otherwise hold the lock
    for the whole request)."""
    sequences = max(1, min(limits.chunk_sequences, limits.chunk_tokens // max(1, params.max_new_tokens)))
    if params.n > sequences:
        for prompt in range(prompts):
            for done in range(0, params.n, sequences):
                yield prompt, 1, min(sequences, params.n - done)
        return
    per_chunk = sequences // params.n
    for first in range(0, prompts, per_chunk):
        yield first, min(per_chunk, prompts - first), params.n


def _base_layer_name(name: str, own: dict) -> str:
    """A model weight's name in a model with LoRA adapters loaded (PEFT moves ``q_proj.weight`` to
    ``q_proj.base_layer.weight``)."""
    if name in own:
        return name
    module, _, leaf = name.rpartition(".")
    wrapped = f"{module}.base_layer.{leaf}"
    return wrapped if wrapped in own else name


def _params(request: CompletionRequest | ChatRequest, max_tokens: int) -> SamplingParams:
    if request.stream:
        raise ApiError(400, "stream: true is not supported by this server", param="stream")
    if request.stop:
        raise ApiError(400, "stop strings are not supported; use stop_token_ids", param="stop")
    if request.best_of not in (None, request.n):
        raise ApiError(400, "best_of other than n is not supported", param="best_of")
    return SamplingParams(
        n=request.n,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_k=max(request.top_k or 0, 0),
        top_p=1.0 if request.top_p is None else request.top_p,
        min_p=request.min_p or 0.0,
        max_new_tokens=max_tokens,
        ignore_eos=request.ignore_eos,
    )


def _usage(prompts: list[list[int]], groups: list[list[Completion]]) -> dict:
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(c.token_ids) for g in groups for c in g)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _completion_prompts(server: ModelServer, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    return [
        server.tokenizer(p, add_special_tokens=True)["input_ids"] if isinstance(p, str) else list(p) for p in prompt
    ]


def completions(server: ModelServer, request: CompletionRequest) -> dict:
    if request.echo:
        raise ApiError(400, "echo is not supported", param="echo")
    if request.suffix:
        raise ApiError(400, "suffix is not supported", param="suffix")
    prompts = _completion_prompts(server, request.prompt)
    params = _params(request, request.max_tokens or 16)
    groups = server.generate(request.model, prompts, params, request.seed, request.stop_token_ids)
    as_ids = bool(request.return_tokens_as_token_ids)
    scored: dict[int, list] = {}  # prompt_logprobs of each prompt, computed once for its n choices
    choices = []
    for number, completion in ((p, c) for p, g in enumerate(groups) for c in g):
        choice: dict[str, Any] = {
            "index": len(choices),
            "text": completion.text,
            "logprobs": None,
            "finish_reason": completion.finish_reason,
            "stop_reason": None,
        }
        if request.logprobs is not None:
            tops = server.top_logprobs(request.model, completion, params.temperature, request.logprobs)
            tokens = [server.token_text(t, as_ids) for t in completion.token_ids]
            offsets = list(
                itertools.accumulate((len(server.tokenizer.decode([t])) for t in completion.token_ids), initial=0)
            )[:-1]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": completion.logprobs,
                "top_logprobs": [
                    {**{server.token_text(t, as_ids): v for t, v in top}, token: lp}
                    for token, lp, top in zip(tokens, completion.logprobs, tops)
                ],
                "text_offset": offsets,
            }
        if request.prompt_logprobs is not None:
            if number not in scored:
                scored[number] = server.prompt_logprobs(request.model, prompts[number], request.prompt_logprobs)
            choice["prompt_logprobs"] = scored[number]
        choices.append(choice)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": request.model or server.served_name,
        "choices": choices,
        "usage": _usage(prompts, groups),
    }


def chat_completions(server: ModelServer, request: ChatRequest) -> dict:
    try:
        prompt = render_prompt(server.tokenizer, openai_history(request.messages), request.tools)
    except Exception as exc:  # a template error is the request's fault
        raise ApiError(400, f"cannot apply the chat template to messages: {exc}", param="messages") from None
    max_tokens = request.max_completion_tokens or request.max_tokens or server.max_new_tokens
    if server.max_length:
        max_tokens = min(max_tokens, max(server.max_length - len(prompt), 1))
    params = _params(request, max_tokens)
    groups = server.generate(request.model, [prompt], params, request.seed, request.stop_token_ids)
    choices = []
    for completion in groups[0]:
        logprobs = None
        if request.logprobs:
            k = request.top_logprobs or 0
            tops = server.top_logprobs(request.model, completion, params.temperature, k)
            logprobs = {
                "content": [
                    {**_chat_token(server, t, lp), "top_logprobs": [_chat_token(server, i, v) for i, v in top]}
                    for t, lp, top in zip(completion.token_ids, completion.logprobs, tops)
                ]
            }
        message, finish = _assistant_message(completion, request.tools)
        choices.append({"index": len(choices), "message": message, "logprobs": logprobs, "finish_reason": finish})
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model or server.served_name,
        "choices": choices,
        "usage": _usage([prompt], groups),
    }


def _assistant_message(completion: Completion, tools: list[dict[str, Any]] | None) -> tuple[dict, str]:
    """The answer as OpenAI's message: with ``tools`` offered, the calls in the model's text (its own format:
    ``rollout.tool_calls``) as ``tool_calls`` (``finish_reason: tool_calls``), as vLLM's tool parsers do."""
    parsed = parse_tool_calls(completion.text, tool_names(tools)) if tools else None
    if parsed is None or not parsed.calls or completion.finish_reason != "stop":
        return {"role": "assistant", "content": completion.text}, completion.finish_reason
    calls = [{**c, "id": f"call{uuid.uuid4().hex[:5]}"} for c in parsed.calls]  # 9 characters (Mistral's)
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}, "tool_calls"


def _chat_token(server: ModelServer, token_id: int, logprob: float) -> dict:
    text = server.tokenizer.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def build_app(server: ModelServer, api_key: str | None = None) -> FastAPI:
    """The routes; with ``api_key``, every route but ``/health`` needs ``Authorization: Bearer api_key``."""
    from fastapi.exceptions import RequestValidationError
    from starlette.concurrency import run_in_threadpool

    app = FastAPI(title="OpenRFT generation server")

    if api_key:

        @app.middleware("http")
        async def _authenticate(request: Request, call_next):
            if request.url.path == "/health" or key_matches(request.headers.get("authorization"), api_key):
                return await call_next(request)
            message = "Incorrect or missing API key: send Authorization: Bearer KEY (the server's --api-key)"
            return JSONResponse(
                {"error": {"message": message, "type": "AuthenticationError", "param": None, "code": 401}},
                status_code=401,
            )

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.status}},
            status_code=exc.status,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return JSONResponse(
            {"error": {"message": problems, "type": "BadRequestError", "param": None, "code": 400}}, status_code=400
        )

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return server.models()

    @app.post("/v1/completions")
    async def create_completion(request: CompletionRequest) -> dict:
        return await run_in_threadpool(completions, server, request)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: ChatRequest) -> dict:
        return await run_in_threadpool(chat_completions, server, request)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: LoadAdapterRequest) -> PlainTextResponse:
        await run_in_threadpool(server.load_adapter, request.lora_name, request.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{request.lora_name}' added successfully.")

    @app.post("/v1/load_weights")
    async def load_weights(request: LoadWeightsRequest) -> PlainTextResponse:
        count = await run_in_threadpool(server.load_weights, request.path)
        return PlainTextResponse(f"Success: {count} weight tensors loaded from '{request.path}'.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: UnloadAdapterRequest) -> PlainTextResponse:
        if not request.lora_name:
            raise ApiError(400, "lora_name is required", param="lora_name")
        await run_in_threadpool(server.unload_adapter, request.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{request.lora_name}' removed successfully.")

    return app


def load_server(
    model_name: str,
    *,
    served_name: str | None = None,
    adapters: dict[str, str] | None = None,
    device: str = "auto",
    dtype: str = "auto",
    max_new_tokens: int = 512,
    seed: int = 0,
    threads: int | None = None,
    limits: ServeLimits | None = None,
) -> ModelServer:
    from openrft.models import (
        configure_threads,
        eos_token_ids,
        load_causal_lm,
        load_tokenizer,
        pick_device,
        pick_dtype,
        resolve_model_path,
    )

    configure_threads(threads)
    torch_device = pick_device(device)
    tokenizer = load_tokenizer(model_name)
    model = load_causal_lm(model_name, torch_device, pick_dtype(dtype, torch_device)).eval()
    server = ModelServer(
        model,
        tokenizer,
        eos_token_ids(tokenizer, model),
        served_name or model_name,
        root=resolve_model_path(model_name),
        max_new_tokens=max_new_tokens,
        seed=seed,
        limits=limits,
    )
    for name, path in (adapters or {}).items():
        server.load_adapter(name, path, trusted=True)
    return server
