"""OpenAI ``graders/run`` and ``graders/validate``, and Vertex's reward validation call: the logic is the
rewards package's (the grader's kind builds and scores it, ``openrft.rewards.validation`` runs it once);
this module maps requests and errors, and runs grader calls off the API's event loop (``WorkPool``).

The request's documents are bounded (depth, size) and the item's messages checked with the request body
(``service/schemas.py``), before anything here runs.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from openrft.data.records import Example
from openrft.errors import OpenRFTError
from openrft.rewards.config_files import reward_spec_from_document
from openrft.rewards.kinds.openai_graders import run_view
from openrft.rewards.kinds.vertex import validate_view
from openrft.rewards.registry import ManagedReward, build_reward
from openrft.rewards.types import RewardOutcome
from openrft.rewards.validation import example_from_line
from openrft.service.config import ServiceConfig
from openrft.service.errors import ApiError, from_spec_error
from openrft.service.tenancy import raise_problems, reward_problems
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.rewards import RewardSpec


def _checked_reward(
    document: dict[str, Any], prefix: str, tenant: ServiceConfig | None
) -> tuple[RewardSpec, ManagedReward]:
    """The reward spec of a grader or reward config and its reward, built (once), or a 400 naming the user's
    field paths. With ``tenant`` (the service's config), a tenant's request: operator settings are refused
    (403) before anything is built. The caller closes the reward."""
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
    """The request's item (its messages already checked and normalised with the body) as a dataset line."""
    fields = dict(item) if isinstance(item, dict) else {}
    if reference_answer is not None:
        fields.setdefault("reference_answer", reference_answer)
    messages = fields.pop("messages", [])
    return Example(id=str(fields.get("id", "item")), messages=messages, fields=fields, tools=fields.pop("tools", None))


def run(
    grader: dict[str, Any], model_sample: str, item: Any, reference_answer: Any, tenant: ServiceConfig | None
) -> dict[str, Any]:
    spec, reward = _checked_reward(grader, "grader", tenant)
    example = _item_example(item, reference_answer)
    outcome = reward.score_one(example, model_sample)
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


def validate_vertex_reward(body: dict[str, Any], tenant: ServiceConfig | None) -> dict[str, Any]:
    key = "singleRewardConfig" if "singleRewardConfig" in body else "compositeRewardConfig"
    spec, reward = _checked_reward({key: body[key]}, key, tenant)
    try:
        example = example_from_line(body["example"], "example")
    except OpenRFTError as exc:
        asyncio.run(reward.aclose())
        raise ApiError(400, str(exc), "invalid_example", "example") from None
    parts = body["sampleResponse"].get("parts") or []
    response = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    outcome = reward.score_one(example, response)
    _refuse_over_limit(outcome, "sampleResponse")
    return validate_view(spec, outcome)


T = TypeVar("T")


class WorkPool:
    """CPU and subprocess work of requests (grader runs) off the API's event loop, in a bounded pool.

    ``graders/run`` and Vertex's reward validation start a sandbox and wait for user code: seconds each.
    Run on the server's shared request threads, 40 of them were enough to stall every other route,
    ``/health`` included. They run here instead: ``workers`` at once, at most ``queue_limit`` more
    waiting, and a request past that gets 429 with ``Retry-After`` rather than waiting without bound.
    """

    def __init__(self, workers: int, queue_limit: int, name: str = "openrft-work"):
        self.workers = workers
        self.queue_limit = queue_limit
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._taken = 0  # running + waiting; only changed on the event loop's thread

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        if self._taken >= self.workers + self.queue_limit:
            raise ApiError(
                429,
                f"the server is running {self.workers} grader calls with {self.queue_limit} more waiting; "
                "retry in a few seconds",
                "rate_limit_exceeded",
                headers={"Retry-After": "5"},
            )
        self._taken += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(function, *args))
        finally:
            self._taken -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
