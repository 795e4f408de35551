"""OpenAI ``graders/run`` and ``graders/validate``, and Vertex's reward validation call: the logic is the
rewards package's (``openrft.rewards.validation``); this module maps requests and errors."""

from __future__ import annotations

from typing import Any

from openrft.data.records import Example
from openrft.data.validation import check_messages
from openrft.errors import OpenRFTError
from openrft.rewards.config_files import reward_spec_from_document
from openrft.rewards.types import RewardOutcome
from openrft.rewards.validation import (
    example_from_line,
    openai_run_view,
    score_once,
    validate,
    vertex_validate_view,
)
from openrft.service.config import ServiceConfig
from openrft.service.errors import ApiError, check_request_document, from_spec_error
from openrft.service.tenancy import raise_problems, reward_problems
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.rewards import RewardSpec


def _checked_spec(document: dict[str, Any], prefix: str, tenant: ServiceConfig | None) -> RewardSpec:
    """The reward spec of a grader or reward config, or a 400 naming the user's field paths. With
    ``tenant`` (the service's config), a tenant's request: operator settings are refused (403)."""
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
        problems = validate(spec)
    except SpecError as exc:
        raise from_spec_error(_prefixed(exc.problems, prefix), "invalid_grader") from None
    if problems:
        raise from_spec_error(_prefixed(problems, prefix), "invalid_grader")
    return spec


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


def run(
    grader: dict[str, Any], model_sample: str, item: Any, reference_answer: Any, tenant: ServiceConfig | None
) -> dict[str, Any]:
    spec = _checked_spec(grader, "grader", tenant)
    check_request_document(item, "item")
    outcome = score_once(spec, _item_example(item, reference_answer), model_sample)
    _refuse_over_limit(outcome, "model_sample")
    return openai_run_view(spec, outcome)


def _refuse_over_limit(outcome: RewardOutcome, param: str) -> None:
    """A grader input past a cap (rewards/input_limits.py) is the request's fault: 400 naming the cap."""
    if outcome.limit:
        raise ApiError(400, outcome.error_message or outcome.limit, "input_too_large", param)


def validate_grader(grader: dict[str, Any], tenant: ServiceConfig | None) -> dict[str, Any]:
    _checked_spec(grader, "grader", tenant)
    return {"grader": grader}


def validate_vertex_reward(body: dict[str, Any], tenant: ServiceConfig | None) -> dict[str, Any]:
    key = "singleRewardConfig" if "singleRewardConfig" in body else "compositeRewardConfig"
    spec = _checked_spec({key: body[key]}, key, tenant)
    try:
        example = example_from_line(body["example"], "example")
    except OpenRFTError as exc:
        raise ApiError(400, str(exc), "invalid_example", "example") from None
    parts = body["sampleResponse"].get("parts") or []
    response = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    outcome = score_once(spec, example, response)
    _refuse_over_limit(outcome, "sampleResponse")
    return vertex_validate_view(spec, outcome)
