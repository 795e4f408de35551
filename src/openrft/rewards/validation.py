"""Try a reward on one example, and check a reward configuration: the logic behind
``openrft rewards test|validate`` and the service calls that mirror them (Vertex's reward
validation call, OpenAI's ``graders/run`` and ``graders/validate``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from openrft.data.records import Example
from openrft.data.validation import parse_record
from openrft.errors import OpenRFTError
from openrft.rewards.checks import check_reward
from openrft.rewards.factory import build_reward
from openrft.rewards.types import RewardOutcome, RewardSample, checked
from openrft.spec.errors import FieldProblem
from openrft.spec.rewards import OpenAIGraderReward, RewardSpec, VertexReward


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
    reward = build_reward(spec)

    async def go() -> RewardOutcome:
        try:
            started = time.perf_counter()
            outcome = checked((await reward.score([RewardSample(example, response, step=step)]))[0], reward.name)
            if outcome.latency_s is None:
                outcome.latency_s = time.perf_counter() - started
            return outcome
        finally:
            await reward.aclose()

    return asyncio.run(go())


def validate(spec: RewardSpec) -> list[FieldProblem]:
    """Problems a configuration has beyond its shape (the shape was checked when ``spec`` was made)."""
    return check_reward(spec)


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


def vertex_validate_view(spec: RewardSpec, outcome: RewardOutcome) -> dict[str, Any]:
    """The shape of Vertex's reward validation answer: overallReward, error, rewardInfoDetails."""
    details: dict[str, Any] = {
        name: {"reward": value, "userRequestedAuxInfo": ""} for name, value in outcome.sub_scores.items()
    }
    config = spec.function
    if isinstance(config, VertexReward) and config.single is not None and outcome.ok:
        details[config.single.rewardName or "reward"] = {"reward": outcome.score, "userRequestedAuxInfo": ""}
    error = None if outcome.ok else f"{outcome.error_kind}: {outcome.error_message}"
    return {"overallReward": outcome.score, "error": error, "rewardInfoDetails": details}


def openai_run_view(spec: RewardSpec, outcome: RewardOutcome) -> dict[str, Any]:
    """The shape of OpenAI's ``graders/run`` answer (reward, metadata.errors flags, sub_rewards)."""
    grader = spec.function.grader if isinstance(spec.function, OpenAIGraderReward) else None
    grader_type = getattr(grader, "type", spec.function.type)
    model_grader = grader_type in ("score_model", "label_model")
    kind = outcome.error_kind
    errors = {
        "formula_parse_error": False,
        "sample_parse_error": kind == "parse_error" and not model_grader,
        "truncated_observation_error": False,
        "unresponsive_reward_error": kind == "timeout",
        "invalid_variable_error": kind == "invalid_output",
        "other_error": kind == "runtime_error" and grader_type not in ("python", "multi"),
        "python_grader_server_error": kind == "server_error" and grader_type == "python",
        "python_grader_server_error_type": None,
        "python_grader_runtime_error": kind == "runtime_error" and grader_type in ("python", "multi"),
        "python_grader_runtime_error_details": outcome.error_message if kind == "runtime_error" else None,
        "model_grader_server_error": kind == "server_error" and model_grader,
        "model_grader_refusal_error": False,
        "model_grader_parse_error": kind == "parse_error" and model_grader,
        "model_grader_server_error_details": outcome.error_message if kind == "server_error" else None,
    }
    return {
        "reward": outcome.score if outcome.ok else 0.0,
        "metadata": {
            "name": getattr(grader, "name", spec.function.type),
            "type": grader_type,
            "errors": errors,
            "execution_time": outcome.latency_s,
            "scores": outcome.sub_scores,
            "token_usage": None,
            "sampled_model_name": None,
        },
        "sub_rewards": outcome.sub_scores,
        "model_grader_token_usage_per_model": {},
    }
