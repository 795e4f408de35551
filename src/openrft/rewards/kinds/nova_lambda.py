"""The Nova reward "Lambda" contract: batches of samples, several invocations in flight.

Each invocation sends a JSON list of up to ``batch_size`` entries (``nova_entry``), over HTTP
(a POST), to a handler file in the sandbox or to AWS Lambda (``lambdas``), and expects a list with
one ``{id, aggregate_reward_score, metrics_list}`` per entry. Entries are matched to samples by
``id`` when the ids of the batch are unique, else by position. ``metrics_list`` items of type
``Reward`` become sub-scores, ``Metric`` items metrics. ``aggregate_reward_score`` is required (a number);
the optional ``metrics_list`` items that are malformed are dropped with a warning, the score kept.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from openrft.calls.endpoints import RemoteEndpoint, Timer, gather_all
from openrft.rewards.kinds import REWARD_ROOT, Needs
from openrft.rewards.lambdas import AwsLambdaInvoker, HandlerInvoker, split_handler
from openrft.rewards.types import RewardContext, RewardFailure, RewardOutcome, RewardSample, as_score, check_source
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.rewards import NovaLambdaReward, RewardSpec

CONFIG = NovaLambdaReward

NOVA_TIMEOUT_S = 900.0  # the service allows 15 minutes per invocation


def nova_entry(sample: RewardSample) -> dict[str, Any]:
    """One sample of a Nova/Bedrock reward Lambda's event, as the services send it: the dataset line with a
    unique ``id`` and the rollout's messages (the assistant's answer, its ``tool_calls`` and the tool results of
    a multi-turn rollout) appended to ``messages``, its other fields (``reference_answer``, ``tools``, ...) at
    the top level. ``metadata`` also holds those fields (merged with the line's own ``metadata`` object, if
    any), for Lambdas that read ``sample["metadata"]["reference_answer"]``."""
    example = sample.example
    row = {k: v for k, v in example.fields.items() if k not in ("id", "messages")}
    if example.tools is not None:
        row.setdefault("tools", example.tools)
    metadata = {k: v for k, v in row.items() if k != "metadata"}
    if isinstance(row.get("metadata"), dict):
        metadata.update(row["metadata"])
    messages = [*example.messages, *sample.output_messages]
    return {"id": example.id, "messages": messages, **row, "metadata": metadata}


def parse_result_entry(entry: Any, what: str) -> RewardOutcome:
    """One scored entry: a number, ``{score, sub_scores, metrics}``, or a Nova output entry."""
    if not isinstance(entry, dict):
        return RewardOutcome(score=as_score(entry, what))
    if "aggregate_reward_score" in entry:
        outcome = RewardOutcome(score=as_score(entry["aggregate_reward_score"], f"{what} aggregate_reward_score"))
        metrics_list = entry.get("metrics_list")
        if metrics_list is None:
            return outcome
        if not isinstance(metrics_list, list):
            outcome.warnings.append(f"{what} metrics_list is {type(metrics_list).__name__}, not a list; dropped")
            return outcome
        for item in metrics_list:
            _read_metric(item, outcome, what)
        return outcome
    if "score" in entry:
        outcome = RewardOutcome(score=as_score(entry["score"], f"{what} score"))
        for key, target in (("sub_scores", outcome.sub_scores), ("metrics", outcome.metrics)):
            values = entry.get(key) or {}
            if not isinstance(values, dict):
                raise RewardFailure("invalid_output", f"{what} {key} must be an object of numbers")
            for name, value in values.items():
                target[str(name)] = as_score(value, f"{what} {key}.{name}")
        return outcome
    raise RewardFailure("invalid_output", f"{what} answered {str(entry)[:100]} without aggregate_reward_score")


def _read_metric(item: Any, outcome: RewardOutcome, what: str) -> None:
    """One ``metrics_list`` item into the outcome's sub-scores (``Reward``) or metrics (``Metric``); a malformed
    item (no ``name``, a value that is not a number, another type) is dropped with a warning: the list is
    optional, and the required ``aggregate_reward_score`` still scores the sample."""
    name = item.get("name") if isinstance(item, dict) else None
    if not isinstance(name, str) or not name:
        outcome.warnings.append(f"{what} metrics_list item {str(item)[:100]} has no name; dropped")
        return
    kind = item.get("type", "Metric")
    if not isinstance(kind, str) or kind.capitalize() not in ("Reward", "Metric"):
        outcome.warnings.append(f"{what} metric {name} has type {kind!r}, not Reward or Metric; dropped")
        return
    try:
        value = as_score(item.get("value"), f"{what} metric {name}")
    except RewardFailure as failure:
        outcome.warnings.append(f"{failure.message}; dropped")
        return
    (outcome.sub_scores if kind.capitalize() == "Reward" else outcome.metrics)[name] = value


def match_entries(sent: list[dict[str, Any]], answer: Any, what: str) -> list[RewardOutcome]:
    """One outcome per sent entry from a Nova output list (failures per entry where possible)."""
    if not isinstance(answer, list):
        raise RewardFailure("invalid_output", f"{what} answered {type(answer).__name__}, not a list of results")
    ids = [e["id"] for e in sent]
    by_id: dict[Any, Any] | None = None
    if len(set(ids)) == len(ids) and all(isinstance(a, dict) and "id" in a for a in answer):
        by_id = {str(a["id"]): a for a in answer}
    elif len(answer) != len(sent):
        raise RewardFailure("invalid_output", f"{what} answered {len(answer)} results for {len(sent)} samples")
    outcomes = []
    for position, entry in enumerate(sent):
        result = by_id.get(str(entry["id"])) if by_id is not None else answer[position]
        try:
            if result is None:
                raise RewardFailure("invalid_output", f"{what} answered no result for id {entry['id']!r}")
            if isinstance(result, dict) and "id" not in result:
                raise RewardFailure(
                    "invalid_output", f"{what} result {position} has no id, which the Lambda contract requires"
                )
            if by_id is None and isinstance(result, dict) and str(result["id"]) != str(entry["id"]):
                raise RewardFailure(
                    "invalid_output", f"{what} result {position} has id {result['id']!r}, expected {entry['id']!r}"
                )
            outcomes.append(parse_result_entry(result, what))
        except RewardFailure as failure:
            outcomes.append(RewardOutcome.of_failure(failure))
    return outcomes


def unwrap_answer(answer: Any) -> Any:
    """A Lambda's answer; an API-Gateway-style ``{"statusCode", "body": "<json>"}`` is unwrapped to its body."""
    if isinstance(answer, dict) and isinstance(answer.get("body"), str) and "statusCode" in answer:
        try:
            return json.loads(answer["body"])
        except ValueError:
            return answer
    return answer


class Invoker(Protocol):
    label: str

    async def invoke(self, event: list[dict[str, Any]]) -> Any: ...


class HttpInvoker:
    def __init__(self, endpoint: RemoteEndpoint):
        self.endpoint = endpoint
        self.label = endpoint.label

    async def invoke(self, event: list[dict[str, Any]]) -> Any:
        return await self.endpoint.post_json(event)


class NovaLambdaFunction:
    name = "nova_lambda"
    requires_reference = False

    def __init__(self, invoker: Invoker, batch_size: int, concurrency_limit: int):
        self.invoker = invoker
        self.batch_size = batch_size
        self.semaphore = asyncio.Semaphore(concurrency_limit)

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        batches = [samples[i : i + self.batch_size] for i in range(0, len(samples), self.batch_size)]
        results = await gather_all(self._call(batch) for batch in batches)
        return [outcome for batch in results for outcome in batch]

    async def _call(self, batch: list[RewardSample]) -> list[RewardOutcome]:
        sent = [nova_entry(s) for s in batch]
        async with self.semaphore:
            timer = Timer()
            try:
                answer = unwrap_answer(await self.invoker.invoke(sent))
                outcomes = match_entries(sent, answer, self.invoker.label)
            except RewardFailure as failure:
                outcomes = [RewardOutcome.of_failure(failure) for _ in batch]
        for outcome in outcomes:
            outcome.latency_s = timer.elapsed
        return outcomes

    async def aclose(self) -> None:
        return None


def build(config: NovaLambdaReward, spec: RewardSpec, context: RewardContext) -> NovaLambdaFunction:
    """Over HTTP, to a handler file in the sandbox (read and checked here, once), or to AWS Lambda."""
    invoker: Invoker
    if config.transport == "handler":
        invoker = _handler(config.endpoint, spec, context)
    elif config.transport == "aws":
        invoker = AwsLambdaInvoker(config.endpoint, spec.remote.timeout_s or NOVA_TIMEOUT_S)
    else:
        invoker = HttpInvoker(context.endpoint(config.endpoint, NOVA_TIMEOUT_S, "Nova reward endpoint"))
    return NovaLambdaFunction(invoker, config.batch_size, config.concurrency_limit)


def _handler(target: str, spec: RewardSpec, context: RewardContext) -> HandlerInvoker:
    """A Lambda handler file: it reads, compiles and defines ``handler(event, context)``; the sandbox runs."""
    path, handler = split_handler(target)
    where = f"{REWARD_ROOT}.endpoint"
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as exc:
        problem = FieldProblem(where, f"cannot be read: {exc.strerror}", str(path))
        raise SpecError([problem], "the reward configuration") from None
    problems = check_source(source, handler, 2, where)
    pool = context.pool(where, problems)
    if pool is None or problems:
        raise SpecError(problems, "the reward configuration")
    return HandlerInvoker(target, source, pool, spec.sandbox.time_limit_s or NOVA_TIMEOUT_S)


def needs(config: NovaLambdaReward) -> Needs:
    if config.transport == "handler":
        return Needs(files=[("endpoint", config.endpoint)])
    if config.transport == "aws":
        return Needs(
            privileges=[("endpoint", config.endpoint, "invoking an AWS Lambda with the service's credentials")]
        )
    return Needs(endpoints=[("endpoint", config.endpoint)])
