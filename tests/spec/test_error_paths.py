"""Error paths name the user's own fields: pydantic's union tags and member labels are dropped."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, ValidationError

from openrft.spec.error_paths import user_loc
from openrft.spec.errors import problems_from_validation
from openrft.spec.rewards import GraderMessage, RewardSpec


class Inner(BaseModel):
    n: int


class Plain(BaseModel):
    size: Literal["auto"] | int
    either: list[int] | Inner
    items: dict[str, tuple[int, Inner]] = {}


def errors(model, data) -> list[tuple]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [(item["loc"], user_loc(model, item["loc"])) for item in info.value.errors(include_url=False)]


def test_discriminated_union_tags_are_dropped_and_same_named_keys_kept():
    # the grader key "python" is the user's, the tag "python" after it is pydantic's
    data = {
        "function": {
            "type": "openai_grader",
            "grader": {
                "type": "multi",
                "name": "m",
                "calculate_output": "python",
                "graders": {"python": {"type": "python", "name": "p", "source": ""}},
            },
        }
    }
    [(raw, clean)] = errors(RewardSpec, data)
    assert raw == ("function", "openai_grader", "grader", "multi", "graders", "python", "python", "source")
    assert clean == ["function", "grader", "graders", "python", "source"]


def test_vertex_reward_paths_through_lists():
    data = {
        "function": {
            "type": "vertex",
            "composite": {
                "weightedRewardConfigs": [
                    {"rewardConfig": {"codeExecutionRewardScorer": {"pythonCodeSnippet": "x"}}},
                    {"rewardConfig": {"codeExecutionRewardScorer": {}}},
                ]
            },
        }
    }
    [(raw, clean)] = errors(RewardSpec, data)
    assert raw[:2] == ("function", "vertex")
    assert clean == [
        "function",
        "composite",
        "weightedRewardConfigs",
        1,
        "rewardConfig",
        "codeExecutionRewardScorer",
        "pythonCodeSnippet",
    ]


def test_message_content_is_told_apart_by_shape():
    found = errors(GraderMessage, {"role": "user", "content": [{"type": "input_text"}]})
    assert found == [(("content", "parts", 0, "input_text", "text"), ["content", 0, "text"])]
    found = errors(GraderMessage, {"role": "user", "content": {"type": "output_text", "text": 1}})
    assert found == [(("content", "part", "output_text", "text"), ["content", "text"])]


def test_plain_union_member_labels_are_dropped():
    found = errors(Plain, {"size": "big", "either": [1, "x"], "items": {"k": [1, {"n": "y"}]}})
    raw = [r for r, _ in found]
    assert ("size", "literal['auto']") in raw and ("size", "int") in raw  # what pydantic reports
    assert ("either", "list[int]", 1) in raw and ("either", "Inner") in raw
    clean = [c for _, c in found]
    assert clean == [["size"], ["size"], ["either", 1], ["either"], ["items", "k", 1, "n"]]


def test_unknown_fields_keep_their_path():
    data = {"function": {"type": "preset", "name": "exact_match", "extra": {"deeper": 1}}}
    [(_, clean)] = errors(RewardSpec, data)
    assert clean == ["function", "extra"]


def test_problems_use_the_cleaned_path_after_prefix_and_skip():
    with pytest.raises(ValidationError) as info:
        RewardSpec.model_validate(
            {
                "function": {
                    "type": "openai_grader",
                    "grader": {
                        "type": "string_check",
                        "name": "a",
                        "input": "x",
                        "reference": "y",
                        "operation": "equals",
                    },
                }
            }
        )
    [problem] = problems_from_validation(info.value, RewardSpec, "method.reinforcement", skip=1)
    assert str(problem) == "method.reinforcement.grader.operation: 'equals' is not one of 'eq', 'ne', 'like', 'ilike'"
