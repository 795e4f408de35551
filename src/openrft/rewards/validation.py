"""Try a reward on one example, and check a reward configuration: the logic behind
``openrft rewards test|validate`` and the service calls that mirror them (Vertex's reward
validation call, OpenAI's ``graders/run`` and ``graders/validate``). Their answers' shapes are the
kinds' (``kinds.openai_graders.run_view``, ``kinds.vertex.validate_view``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from openrft.data.records import Example
from openrft.data.validation import parse_record
from openrft.errors import OpenRFTError
from openrft.rewards.types import RewardOutcome, build_reward
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.rewards import RewardSpec


def example_from_line(obj: Any, source: str = "example") -> Example:
    """A dataset line (messages format, or Vertex's contents format) as an Example."""
    if isinstance(obj, dict) and "contents" in obj and "messages" not in obj:
        messages = []
        system = obj.get("systemInstruction") or {}
        system_text = "".join(p.get("text", "") for p in system.get("parts", []) if isinstance(p, dict))
        if system_text:
            messages.append({"role": "system", "content": system_text})
        for content in obj.get("contents") or []:
            role = "assistant" if content.get("role") == "model" else "user"
            text = "".join(p.get("text", "") for p in content.get("parts", []) if isinstance(p, dict))
            messages.append({"role": role, "content": text})
        fields = {k: v for k, v in obj.items() if k != "id"}
        return Example(id=str(obj.get("id", "example")), messages=messages, fields=fields)
    example, problems = parse_record(obj, 1, False)
    if example is None:
        raise OpenRFTError(f"{source}: not a dataset line: " + "; ".join(f"{f}: {m}" for f, m in problems))
    return example


def score_once(spec: RewardSpec, example: Example, response: str, step: int = 0) -> RewardOutcome:
    return build_reward(spec).score_one(example, response, step)


def validate(spec: RewardSpec) -> list[FieldProblem]:
    """Problems a configuration has beyond its shape (the shape was checked when ``spec`` was made): those its
    kind finds as it builds the reward, which is then closed unused."""
    try:
        reward = build_reward(spec)
    except SpecError as exc:
        return exc.problems
    asyncio.run(reward.aclose())
    return []


def outcome_json(outcome: RewardOutcome) -> dict[str, Any]:
    return {
        "score": outcome.score,
        "sub_scores": outcome.sub_scores,
        "metrics": outcome.metrics,
        "error_kind": outcome.error_kind,
        "error_message": outcome.error_message,
        "latency_s": outcome.latency_s,
        "stdout": outcome.stdout,
        "warnings": outcome.warnings,
    }
