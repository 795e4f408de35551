"""OpenAI ``graders/run`` and ``graders/validate``, and Vertex's reward validation call: the logic is the
rewards package's (the grader's kind builds and scores it, ``openrft.rewards.validation`` runs it once);
this module maps requests and errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import Request

from openrft.data.records import Example
from openrft.data.validation import check_messages
from openrft.errors import OpenRFTError
from openrft.rewards.config_files import reward_spec_from_document
from openrft.rewards.kinds.openai_graders import run_view
from openrft.rewards.kinds.vertex import validate_view
from openrft.rewards.registry import Cancellable, ManagedReward, build_reward
from openrft.rewards.types import RewardOutcome
from openrft.rewards.validation import example_from_line
from openrft.service.config import ServiceConfig
from openrft.service.errors import ApiError, check_request_document, from_spec_error
from openrft.service.tenancy import raise_problems, reward_problems
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.rewards import RewardSpec


def _checked_reward(
    document: dict[str, Any], prefix: str, tenant: ServiceConfig | None
) -> tuple[RewardSpec, ManagedReward]:
    """The reward spec of a grader or reward config and its reward, built (once), or a 400 naming the user's
    field paths. With ``tenant`` (the service's config), a tenant's request: operator settings are refused
    (403) before anything is built. The caller closes the reward."""
    check_request_document(document, prefix)
    try:
        spec = reward_spec_from_document(document)
    except SpecError as exc:
        raise from_spec_error(_prefixed(exc.problems, prefix), "invalid_grader") from None
    if tenant is not None:
        nested = isinstance(document, dict) and "function" in document
        raise_problems(
            reward_problems(spec, tenant, f"{prefix}.function" if nested else prefix, prefix), "invalid_grader"
        )
    try:
        return spec, build_reward(spec)
    except SpecError as exc:
        raise from_spec_error(_prefixed(exc.problems, prefix), "invalid_grader") from None


def _prefixed(problems: list[FieldProblem], prefix: str) -> SpecError:
    def path(p: str) -> str:
        p = p.removeprefix("grader").removeprefix("function.grader").lstrip(".")
        return f"{prefix}.{p}" if p and p != "<root>" else prefix

    return SpecError([FieldProblem(path(p.path), p.message, p.value) for p in problems])


def _item_example(item: Any, reference_answer: Any) -> Example:
    fields = dict(item) if isinstance(item, dict) else {}
    if reference_answer is not None:
        fields.setdefault("reference_answer", reference_answer)
    messages, problems = check_messages(fields.pop("messages")) if "messages" in fields else ([], [])
    if problems:
        raise ApiError(
            400, "item.messages: " + "; ".join(f"{f}: {m}" for f, m in problems), "invalid_item", "item.messages"
        )
    return Example(id=str(fields.get("id", "item")), messages=messages, fields=fields, tools=fields.pop("tools", None))


async def in_pool(request: Request, owner: str, function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run a grader call of ``owner`` in the server's grader pool, in that tenant's turn (429 past its share),
    cancelled (its sandbox killed) if the client hangs up."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    pool = request.app.state.grader_pool
    return await pool.run(function, *args, tenant=owner, disconnected=disconnected, cancellable=True)


def _score(reward: ManagedReward, example: Example, response: str, cancellation: Cancellable | None) -> RewardOutcome:
    try:
        return reward.score_one(example, response, cancellation=cancellation)
    except asyncio.CancelledError:
        raise ApiError(499, "the client closed the connection; the grader call was stopped", "client_closed") from None


def run(
    grader: dict[str, Any],
    model_sample: str,
    item: Any,
    reference_answer: Any,
    tenant: ServiceConfig | None,
    cancellation: Cancellable | None = None,
) -> dict[str, Any]:
    spec, reward = _checked_reward(grader, "grader", tenant)
    try:
        check_request_document(item, "item")
        example = _item_example(item, reference_answer)
    except BaseException:
        asyncio.run(reward.aclose())
        raise
    outcome = _score(reward, example, model_sample, cancellation)
    _refuse_over_limit(outcome, "model_sample")
    return run_view(spec, outcome)


def _refuse_over_limit(outcome: RewardOutcome, param: str) -> None:
    """A grader input past a cap (rewards/input_limits.py) is the request's fault: 400 naming the cap."""
    if outcome.limit:
        raise ApiError(400, outcome.error_message or outcome.limit, "input_too_large", param)


def validate_grader(grader: dict[str, Any], tenant: ServiceConfig | None) -> dict[str, Any]:
    _spec, reward = _checked_reward(grader, "grader", tenant)
    asyncio.run(reward.aclose())
    return {"grader": grader}


def validate_vertex_reward(
    body: dict[str, Any], tenant: ServiceConfig | None, cancellation: Cancellable | None = None
) -> dict[str, Any]:
    key = "singleRewardConfig" if "singleRewardConfig" in body else "compositeRewardConfig"
    spec, reward = _checked_reward({key: body[key]}, key, tenant)
    try:
        example = example_from_line(body["example"], "example")
    except OpenRFTError as exc:
        asyncio.run(reward.aclose())
        raise ApiError(400, str(exc), "invalid_example", "example") from None
    parts = body["sampleResponse"].get("parts") or []
    response = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    outcome = _score(reward, example, response, cancellation)
    _refuse_over_limit(outcome, "sampleResponse")
    return validate_view(spec, outcome)
