"""LLM judges over any OpenAI-compatible chat endpoint (vLLM, OpenRFT's own server, OpenAI).

The endpoint is ``reward.judge.base_url``, else ``$OPENRFT_JUDGE_BASE_URL``, else
``$OPENAI_BASE_URL``; the key is read from ``reward.judge.api_key_env`` (default
``OPENRFT_JUDGE_API_KEY``), else ``$OPENAI_API_KEY``, and sent as a Bearer token.

Reading a score from a reply, in order: a JSON object with a numeric ``result``, ``score``,
``rating``, ``reward`` or ``grade``; a reply that is only a number; the last ``score: 7``-style
phrase. Anything else is a ``parse_error`` (a reply is never read as 0). ``<think>`` blocks are
dropped first.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from openrft.calls.endpoints import RemoteEndpoint
from openrft.calls.failures import CallFailure as RewardFailure
from openrft.data.records import without_thinking
from openrft.spec.call_options import JudgeSpec

JUDGE_TIMEOUT_S = 60.0
SCORE_KEYS = ("result", "score", "rating", "reward", "grade")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_PHRASE = re.compile(rf"\b(?:{'|'.join(SCORE_KEYS)})\b\s*(?:[:=]\s*)?({_NUMBER})", re.IGNORECASE)
"""``score: 7``. (``\\s*[:=]?\\s*`` backtracked quadratically: ``score`` and 8,000 spaces took 5.6 s.)"""


NO_JUDGE_ENDPOINT = (
    "is an LLM judge but no endpoint is set: point OPENRFT_JUDGE_BASE_URL (or OPENAI_BASE_URL, or "
    "reward.judge.base_url) at an OpenAI-compatible chat server (e.g. `openrft serve-model`), and map a "
    "hosted judge model it does not serve with --map MODEL=LOCAL_MODEL"
)


def judge_base_url(spec: JudgeSpec) -> str | None:
    return spec.base_url or os.environ.get("OPENRFT_JUDGE_BASE_URL") or os.environ.get("OPENAI_BASE_URL")


def judge_api_key(spec: JudgeSpec) -> str | None:
    return os.environ.get(spec.api_key_env) or os.environ.get("OPENAI_API_KEY")


def _json_object(text: str) -> dict[str, Any] | None:
    candidates = [text]
    first, last = text.find("{"), text.rfind("}")  # what r"\{.*\}" finds, without its quadratic search
    if 0 <= first < last:
        candidates.append(text[first : last + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


def parse_score(reply: str) -> float:
    text = without_thinking(reply).strip()
    obj = _json_object(text)
    if obj is not None:
        for key in SCORE_KEYS:
            value = obj.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
    if re.fullmatch(_NUMBER, text):
        return float(text)
    phrases = _PHRASE.findall(text)
    if phrases:
        return float(phrases[-1])
    raise RewardFailure("parse_error", f"the judge's reply holds no score: {reply[:120]!r}")


def parse_label(reply: str, labels: list[str]) -> str:
    """The label a reply names: the whole reply, a JSON ``result``/``label``, or the one label it mentions."""
    text = without_thinking(reply).strip()
    folded = {label.casefold(): label for label in labels}
    bare = text.strip(" \t\n.\"'`*").casefold()
    if bare in folded:
        return folded[bare]
    obj = _json_object(text)
    if obj is not None:
        for key in ("result", "label", "answer"):
            value = obj.get(key)
            if isinstance(value, str) and value.casefold() in folded:
                return folded[value.casefold()]
    mentioned = [label for label in labels if re.search(rf"(?<!\w){re.escape(label)}(?!\w)", text, re.IGNORECASE)]
    if len(mentioned) == 1:
        return mentioned[0]
    raise RewardFailure(
        "parse_error", f"the judge's reply names none (or several) of the labels {labels}: {reply[:120]!r}"
    )


def _steps_schema() -> dict[str, Any]:
    step = {
        "type": "object",
        "properties": {"description": {"type": "string"}, "conclusion": {"type": "string"}},
        "required": ["description", "conclusion"],
        "additionalProperties": False,
    }
    return {"type": "array", "items": step}


def grader_response_format(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """The structured output OpenAI's model graders ask their judge for: ``{"steps": [{"description",
    "conclusion"}], "result": ...}`` (the shape the cookbook's grader prompts spell out), as a strict
    ``json_schema`` response format."""
    schema = {
        "type": "object",
        "properties": {"steps": _steps_schema(), "result": result},
        "required": ["steps", "result"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def score_response_format() -> dict[str, Any]:
    return grader_response_format("float_score_classification", {"type": "number"})


def label_response_format(labels: list[str]) -> dict[str, Any]:
    return grader_response_format("label_model_grader", {"type": "string", "enum": list(labels)})


UNSUPPORTED_FORMAT_STATUS = (400, 422)


class ChatJudge:
    """Sends chat completions; at most ``max_concurrency`` in flight.

    A request may carry a ``response_format`` (structured output). When the endpoint refuses one with
    HTTP 400 or 422 the request is sent again without it, and later requests go without it too: many
    local servers do not implement structured output, and a reply is still read for its score."""

    def __init__(self, endpoint: RemoteEndpoint, spec: JudgeSpec):
        self.endpoint = endpoint
        self.spec = spec
        self._semaphore: asyncio.Semaphore | None = None
        self.structured_output = spec.structured_output

    async def complete(
        self,
        model: str | None,
        messages: list[dict[str, str]],
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        response_format: dict[str, Any] | None = None,
    ) -> str:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.spec.max_concurrency)
        payload: dict[str, Any] = {
            "model": self.spec.model or model or "default",
            "messages": messages,
            "max_tokens": max_tokens or self.spec.max_tokens,
        }
        for key, value in (("temperature", temperature), ("top_p", top_p), ("seed", seed)):
            if value is not None:
                payload[key] = value
        async with self._semaphore:
            structured = response_format is not None and self.structured_output
            try:
                body = await self.endpoint.post_json(
                    {**payload, "response_format": response_format} if structured else payload
                )
            except RewardFailure as failure:
                if not structured or failure.status not in UNSUPPORTED_FORMAT_STATUS:
                    raise
                self.structured_output = False  # this endpoint refuses structured output: stop asking for it
                body = await self.endpoint.post_json(payload)
        try:
            content = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise RewardFailure(
                "invalid_output", f"judge answer has no choices[0].message.content: {str(body)[:120]}"
            ) from None
        if not isinstance(content, str):
            raise RewardFailure("invalid_output", f"judge answered content {str(content)[:120]} (a refusal?)")
        return content
