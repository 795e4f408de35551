"""The reward kinds' registry: every reward configuration class has its kind module, and only that module
(or the spec that defines the class) tells configurations apart with isinstance."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import get_args

import pytest

import openrft.spec.rewards as configs
from openrft.errors import RewardError
from openrft.rewards.types import kind_of, needs_of
from openrft.spec.rewards import NovaLambdaReward, RewardConfig, VertexReward

SOURCE = Path(__file__).resolve().parents[2] / "src" / "openrft"
KIND_CONFIGS = get_args(get_args(RewardConfig)[0])
CONFIG_CLASSES = {
    name
    for name, value in vars(configs).items()
    if inspect.isclass(value) and name.endswith(("Reward", "Grader", "Scorer", "RewardConfig"))
}
"""The reward kinds' configuration classes and their parts (OpenAI graders, Vertex scorers)."""


def test_every_reward_config_has_one_kind():
    assert len(KIND_CONFIGS) == 5
    for config in KIND_CONFIGS:
        module = kind_of(config.model_construct())
        assert module.CONFIG is config and module.__name__.startswith("openrft.rewards.kinds.")


def test_an_unknown_config_has_no_kind():
    class Other:
        type = "other"

    with pytest.raises(RewardError, match="'other' is not available"):
        kind_of(Other())  # type: ignore[arg-type]


def test_kinds_say_what_they_reach():
    http = needs_of(NovaLambdaReward(endpoint="http://127.0.0.1:9/"))
    assert http.endpoints == [("endpoint", "http://127.0.0.1:9/")] and not http.files and not http.privileges
    handler = needs_of(NovaLambdaReward(endpoint="/srv/reward.py:lambda_handler"))
    assert handler.files == [("endpoint", "/srv/reward.py:lambda_handler")] and not handler.endpoints
    run = {"cloudRunRewardScorer": {"cloudRunUri": "https://reward.example/score"}}
    composite = VertexReward.model_validate({"composite": {"weightedRewardConfigs": [{"rewardConfig": run}]}})
    assert needs_of(composite).endpoints == [
        ("weightedRewardConfigs[0].rewardConfig.cloudRunRewardScorer.cloudRunUri", "https://reward.example/score")
    ]


def _isinstance_of_configs(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            if names & CONFIG_CLASSES:
                found.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    return found


def test_no_isinstance_on_reward_configs_outside_their_kind():
    allowed = {SOURCE / "spec" / "rewards.py", SOURCE / "rewards" / "types.py"}
    allowed |= set((SOURCE / "rewards" / "kinds").glob("*.py"))
    offenders = [hit for path in SOURCE.rglob("*.py") if path not in allowed for hit in _isinstance_of_configs(path)]
    assert offenders == []
    assert _isinstance_of_configs(SOURCE / "rewards" / "kinds" / "openai_graders.py")  # the scan sees them


def test_a_kind_reports_what_it_cannot_have_at_each_field_as_it_builds(monkeypatch):
    """The sandbox and the judge are asked for as the kind builds: where this machine cannot isolate user code
    and no judge endpoint is set, each part that needs one is named at its path, with the source's own problem,
    in one SpecError."""
    from openrft.calls.sandbox import mechanism
    from openrft.rewards.types import build_reward
    from openrft.spec.errors import SpecError
    from openrft.spec.rewards import reward_spec_from_document

    for name in ("OPENRFT_JUDGE_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(mechanism, "bwrap_path", lambda: None)
    mechanism.strict_unavailable.cache_clear()
    judge = {"type": "score_model", "model": "m", "input": [{"role": "user", "content": "{{sample.output_text}}"}]}
    grader = {
        "type": "multi",
        "graders": {
            "a": {"type": "python", "source": "def grade(sample, item):\n    return 1\n"},
            "b": {"type": "python", "source": "def grade(sample):\n    return 1\n"},
            "c": judge,
        },
        "calculate_output": "a + b + c",
    }
    try:
        with pytest.raises(SpecError) as raised:
            build_reward(reward_spec_from_document(grader))
    finally:
        mechanism.strict_unavailable.cache_clear()
    found = [(p.path, p.message.split(",")[0].split(":")[0]) for p in raised.value.problems]
    root = "reward.function.grader.graders"
    assert found == [
        (f"{root}.a.source", "runs user code"),
        (f"{root}.b.source", "defines grade() with 1 argument(s); it is called with 2"),
        (f"{root}.b.source", "runs user code"),
        (f"{root}.c", "is an LLM judge but no endpoint is set"),
    ]
    assert "bubblewrap (bwrap) is not installed" in raised.value.problems[0].message
