"""The Nova reward "Lambda" contract: batches of samples, several invocations in flight.

Each invocation sends a JSON list of up to ``batch_size`` entries (``views.nova_entry``), over HTTP
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

from openrft.rewards.remote import RemoteEndpoint, Timer, gather_all
from openrft.rewards.types import RewardFailure, RewardOutcome, RewardSample, as_score
from openrft.rewards.views import nova_entry

NOVA_TIMEOUT_S = 900.0  # the service allows 15 minutes per invocation


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
            outcomes.append(failure.outcome())
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
                outcomes = [failure.outcome() for _ in batch]
        for outcome in outcomes:
            outcome.latency_s = timer.elapsed
        return outcomes

    async def aclose(self) -> None:
        return None
