"""Scores that are not finite numbers in [-1e6, 1e6] (1e308, 10**400, NaN) are ``invalid_output`` for their
sample, whatever reward made them: never a crashed job or a traceback."""

import json

import pytest

from openrft.cli import main
from openrft.rewards import build_reward
from openrft.rewards.runner import RewardRunner
from openrft.rewards.types import RewardOutcome, RewardSample, as_score, checked
from openrft.spec.rewards import RewardSpec
from tests.rewards.helpers import example, require_bwrap

SOURCE = """
def grade(sample, item):
    text = sample["output_text"]
    return {"big": 1e308, "huge": 10**400, "nan": float("nan"), "inf": float("inf")}.get(text, 0.5)
"""
GRADER = {"type": "python", "name": "bad", "source": SOURCE}


def test_as_score_bounds():
    assert as_score(1e6, "r") == 1e6 and as_score(-3, "r") == -3.0
    for value in (1e308, 10**400, -(10**400), float("nan"), float("inf"), 1e6 + 1):
        with pytest.raises(Exception) as caught:
            as_score(value, "r")
        assert getattr(caught.value, "kind", None) == "invalid_output", value
    outcome = checked(RewardOutcome(score=0.5, sub_scores={"a": float("nan")}), "r")
    assert outcome.error_kind == "invalid_output" and "sub-score a" in outcome.error_message


def test_each_bad_score_is_invalid_output_for_its_own_sample_in_training():
    require_bwrap()
    runner = RewardRunner(
        build_reward(RewardSpec.model_validate({"function": {"type": "openai_grader", "grader": GRADER}}))
    )
    try:
        texts = ["big", "ok", "huge", "nan", "inf"]
        outcomes = runner.score([RewardSample(example(), t, step=1, sample_index=i) for i, t in enumerate(texts)])
    finally:
        runner.close()
    assert [o.score if o.ok else o.error_kind for o in outcomes] == [
        "invalid_output",
        0.5,
        "invalid_output",
        "invalid_output",
        "invalid_output",
    ]
    assert "10000000000000000000...(401 characters)" in outcomes[2].error_message


@pytest.mark.parametrize("response", ["huge", "big"])
def test_rewards_test_reports_invalid_output_without_a_traceback(tmp_path, capsys, response):
    require_bwrap()
    (tmp_path / "grader.json").write_text(json.dumps(GRADER))
    (tmp_path / "example.json").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    args = ["rewards", "test", str(tmp_path / "grader.json"), "--example", str(tmp_path / "example.json")]
    assert main([*args, "--response", response]) == 1
    assert capsys.readouterr().out.startswith("error invalid_output: python grader bad returned")


def test_a_callable_calling_sys_exit_fails_its_samples_not_the_process():
    from tests.rewards.helpers import scores

    assert scores({"type": "callable", "target": "sys:exit"}, ["a", "b"]) == ["runtime_error", "runtime_error"]
