"""The agent routes a running job serves on 127.0.0.1: SageMaker's multi-turn RL runtime verbs, OpenAI's shapes.

- Sample: ``POST /v1/agent/{job_id}/{trajectory_id}/chat/completions``, an OpenAI chat completion (tool calls
  in OpenAI's ``tool_calls`` shape, ``finish_reason: tool_calls``; ``stream: true`` answers with
  ``chat.completion.chunk`` server-sent events, SageMaker's SampleWithResponseStream). With
  ``base_url=http://HOST/v1/agent/{job_id}/{trajectory_id}`` the official ``openai`` client's
  ``chat.completions.create`` works unchanged.
- CompleteRollout: ``POST /v1/agent/{job_id}/complete-rollout`` ``{"TrajectoryId", "Status": "ready"|"failed",
  "ClientToken"}`` (SageMaker's body), or ``POST .../{trajectory_id}/complete-rollout`` with ``{"Status"}``.
- UpdateReward: ``POST /v1/agent/{job_id}/update-reward`` ``{"TrajectoryId", "Rewards": [number per turn],
  "ClientToken"}``, or ``POST .../{trajectory_id}/update-reward``; the trajectory's reward is their sum.

Every route needs ``Authorization: Bearer TOKEN``, the job's own token (handed to the agent with the
trajectory; the job service's proxy sends it for a tenant whose key owns the job). Errors have OpenAI's
``{"error": {"message", "type", "param", "code"}}`` shape. Where each shape comes from: docs/agents.md.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from openrft.tools.agent_trajectory import Trajectory, TrajectoryError

UNSUPPORTED = {"n": 1, "stop": None, "best_of": None, "echo": None}


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kinds = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 409: "ConflictError"}
    body = {"message": message, "type": kinds.get(status, "InternalServerError"), "param": param, "code": status}
    return JSONResponse({"error": body}, status_code=status)


def _checked(body: Any) -> dict[str, Any]:
    """A Sample body the route can take; what it cannot is refused naming the field."""
    if not isinstance(body, dict):
        raise TrajectoryError(400, "the body is not a JSON object (an OpenAI chat completion request)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise TrajectoryError(400, "messages must be a list of messages, each with a role", "messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise TrajectoryError(400, "tools must be a list of OpenAI function tools", "tools")
    if body.get("n", 1) not in (1, None):
        raise TrajectoryError(400, f"n is {body['n']}: a trajectory samples one answer per turn (n 1)", "n")
    if body.get("stop"):
        raise TrajectoryError(400, "stop strings are not supported: the model's end of turn ends a turn", "stop")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise TrajectoryError(400, f"{name} must be a positive integer, not {value!r}", name)
    return body


def _token_logprobs(renderer, tokens: list[int], logprobs: list[float]) -> dict[str, Any]:
    entries = []
    for token, logprob in zip(tokens, logprobs):
        text = renderer.tokenizer.decode([token])
        entries.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": entries}


def chat_completion(service, trajectory: Trajectory, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    message = dict(answer["message"])
    if message.get("tool_calls") and not message["content"]:
        message["content"] = None  # as OpenAI answers a turn that only calls tools
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": answer["finish_reason"],
    }
    if body.get("logprobs"):
        choice["logprobs"] = _token_logprobs(service.renderer, answer["tokens"], answer["logprobs"])
    prompt = len(trajectory.prompt_ids) + len(trajectory.token_ids) - len(answer["tokens"])
    return {
        "id": f"chatcmpl-{trajectory.id}-{trajectory.stats.turns}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or service.job_id,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": len(answer["tokens"]),
            "total_tokens": prompt + len(answer["tokens"]),
        },
    }


def stream_events(completion: dict[str, Any], include_usage: bool) -> list[str]:
    """The completion as ``chat.completion.chunk`` events: the role, the content, the calls (each whole, with
    its index), the finish reason, the usage when asked for (``stream_options.include_usage``), ``[DONE]``."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        data = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(data)}\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        events.append(chunk({"content": message["content"]}))
    if message.get("tool_calls"):
        calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        events.append(chunk({"tool_calls": calls}))
    events.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        events.append(f"data: {json.dumps({**head, 'choices': [], 'usage': completion['usage']})}\n\n")
    events.append("data: [DONE]\n\n")
    return events


def build_app(service) -> FastAPI:
    app = FastAPI(title="OpenRFT agent routes", docs_url=None, redoc_url=None, openapi_url=None)

    def _authorized(request: Request) -> None:
        """Every route: the job's token (a check in the handlers: cheaper than a middleware, on every turn)."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip(), service.token):
            raise TrajectoryError(
                401,
                "Incorrect or missing token: send Authorization: Bearer TOKEN (the api_key the job gave the agent "
                "with its trajectory)",
            )

    @app.exception_handler(TrajectoryError)
    async def _refused(_: Request, exc: TrajectoryError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.param)

    async def _json(request: Request) -> Any:
        _authorized(request)
        try:
            return await request.json()
        except ValueError:
            raise TrajectoryError(400, "the body is not JSON") from None

    @app.post("/v1/agent/{job_id}/{trajectory_id}/chat/completions")
    async def sample(job_id: str, trajectory_id: str, request: Request):
        body = _checked(await _json(request))  # the token first: nothing about trajectories before it
        trajectory = service.trajectory(job_id, trajectory_id)
        answer = await service.sample(trajectory, body)
        completion = chat_completion(service, trajectory, body, answer)
        if not body.get("stream"):
            return completion
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(iter(stream_events(completion, include_usage)), media_type="text/event-stream")

    def _complete(job_id: str, trajectory_id: Any, body: dict[str, Any]) -> dict:
        status = str(body.get("Status") or "ready").lower()
        if status not in ("ready", "failed"):
            raise TrajectoryError(400, f"Status is {body.get('Status')!r}; allowed: ready, failed", "Status")
        service.complete(service.trajectory(job_id, str(trajectory_id)), status)
        return {}

    def _reward(job_id: str, trajectory_id: Any, body: dict[str, Any]) -> dict:
        rewards = body.get("Rewards")
        if not isinstance(rewards, list):
            raise TrajectoryError(400, f"Rewards must be a list of numbers (one per turn), not {rewards!r}", "Rewards")
        service.trajectory(job_id, str(trajectory_id)).set_reward(rewards, body.get("ClientToken"))
        return {}

    def _object(body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise TrajectoryError(400, "the body is not a JSON object")
        return body

    @app.post("/v1/agent/{job_id}/complete-rollout")
    async def complete_rollout(job_id: str, request: Request) -> dict:
        body = _object(await _json(request))
        return _complete(job_id, _trajectory_id(body), body)

    @app.post("/v1/agent/{job_id}/update-reward")
    async def update_reward(job_id: str, request: Request) -> dict:
        body = _object(await _json(request))
        return _reward(job_id, _trajectory_id(body), body)

    @app.post("/v1/agent/{job_id}/{trajectory_id}/complete-rollout")
    async def complete_trajectory(job_id: str, trajectory_id: str, request: Request) -> dict:
        _authorized(request)
        return _complete(job_id, trajectory_id, _object(await _json(request) if await request.body() else {}))

    @app.post("/v1/agent/{job_id}/{trajectory_id}/update-reward")
    async def reward_trajectory(job_id: str, trajectory_id: str, request: Request) -> dict:
        return _reward(job_id, trajectory_id, _object(await _json(request)))

    return app


def _trajectory_id(body: dict[str, Any]) -> str:
    value = body.get("TrajectoryId")
    if not isinstance(value, str) or not value:
        raise TrajectoryError(400, "TrajectoryId (the trajectory's id) is required", "TrajectoryId")
    return value


async def serve(service) -> tuple[Any, int]:
    """The routes on 127.0.0.1 on a free port, on the running loop; the uvicorn server and its port."""
    import uvicorn

    config = uvicorn.Config(
        build_app(service), host="127.0.0.1", port=0, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not the main thread
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why it could not start
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    server.task = task  # type: ignore[attr-defined]  # what closing waits for
    return server, port
