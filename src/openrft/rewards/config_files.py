"""A reward configuration from a file, in any shape a user has at hand.

Accepted (JSON or YAML): a canonical ``RewardSpec`` (``{function, on_error, ...}``); one reward
config with OpenRFT's ``type`` tag; an OpenAI grader object; a Vertex ``singleRewardConfig`` or
``compositeRewardConfig`` body; a whole Vertex request or OpenAI job (their reward part is read);
a Nova recipe or canonical job file (through the dialect parsers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from openrft.spec.errors import FieldProblem, SpecError, problems_from_validation
from openrft.spec.rewards import Grader, RewardConfig, RewardSpec, SingleRewardConfig

OUR_TYPES = tuple(config.model_fields["type"].default for config in get_args(get_args(RewardConfig)[0]))
"""The ``type`` tags of the reward configurations (``RewardConfig``): no list of kinds to keep here."""
GRADER_TYPES = tuple(get_args(grader.model_fields["type"].annotation)[0] for grader in get_args(get_args(Grader)[0]))
"""OpenAI's grader types (``spec.rewards.Grader``)."""
VERTEX_PROTO_KEYS = {
    "weighted_reward_configs",
    "reinforcement_tuning_spec",
    "string_match_reward_scorer",
    "code_execution_reward_scorer",
    "cloud_run_reward_scorer",
    "autorater_scorer",
}


def _wrap(document: Any) -> tuple[dict[str, Any], str]:
    """The RewardSpec dict for a document, and the prefix that maps its paths back to the user's."""
    if not isinstance(document, dict):
        raise SpecError([FieldProblem("<root>", "is not a reward configuration (expected an object)")])
    if "function" in document:
        return document, ""
    kind = document.get("type")
    if kind in OUR_TYPES:
        return {"function": document}, ""
    if kind in GRADER_TYPES:
        return {"function": {"type": "openai_grader", "grader": document}}, "grader"
    if VERTEX_PROTO_KEYS & set(document):  # a Vertex config in proto field names (the SDK's, gcloud's)
        from openrft.spec.dialects.vertex import canonical_names

        document = canonical_names(document)
    if "weightedRewardConfigs" in document:
        return {"function": {"type": "vertex", "composite": document}}, "compositeRewardConfig"
    if any(key in document for key in SingleRewardConfig.SCORERS):
        return {"function": {"type": "vertex", "single": document}}, "singleRewardConfig"
    tuning = document.get("reinforcementTuningSpec", document)
    if isinstance(tuning, dict):
        for key, slot in (("singleRewardConfig", "single"), ("compositeRewardConfig", "composite")):
            if key in tuning:
                where = f"reinforcementTuningSpec.{key}" if tuning is not document else key
                return {"function": {"type": "vertex", slot: tuning[key]}}, where
    method = document.get("method")
    if (
        isinstance(method, dict)
        and isinstance(method.get("reinforcement"), dict)
        and "grader" in method["reinforcement"]
    ):
        return {
            "function": {"type": "openai_grader", "grader": method["reinforcement"]["grader"]}
        }, "method.reinforcement.grader"
    raise SpecError(
        [
            FieldProblem(
                "<root>",
                "is not a reward configuration: expected an OpenAI grader (type: "
                "string_check, ...), a Vertex singleRewardConfig/compositeRewardConfig, a reward "
                "spec {function: ...}, or a job file",
            )
        ]
    )


def _map_path(problem: FieldProblem, prefix: str) -> FieldProblem:
    """``function.grader.x`` -> the user's own path (``method.reinforcement.grader.x``)."""
    for ours in ("function.grader", "function.single", "function.composite"):
        if problem.path.startswith(ours):
            return FieldProblem(prefix + problem.path[len(ours) :], problem.message, problem.value)
    return problem


def reward_spec_from_document(document: Any, source: str | None = None) -> RewardSpec:
    wrapped, prefix = _wrap(document)
    try:
        return RewardSpec.model_validate(wrapped)
    except ValidationError as exc:
        problems = problems_from_validation(exc, RewardSpec)
        if prefix:
            problems = [_map_path(p, prefix) for p in problems]
        raise SpecError(problems, source) from None


def load_reward_spec(path: str | Path) -> RewardSpec:
    """A reward config file, a job file's reward, or a published Lambda file named ``reward.py:lambda_handler``."""
    from openrft.spec.dialects import detect_dialect, load_job, read_document
    from openrft.spec.dialects.lambdas import resolve_handler

    handler = resolve_handler(str(path), Path.cwd())
    if handler is not None:
        return RewardSpec.model_validate({"function": {"type": "nova_lambda", "endpoint": handler}})
    path = Path(path)
    document = read_document(path)
    if isinstance(document, dict) and (
        "training_config" in document or "run" in document or ("training" in document and "reward" in document)
    ):
        detect_dialect(document)
        return load_job(path).reward
    return reward_spec_from_document(document, str(path))
