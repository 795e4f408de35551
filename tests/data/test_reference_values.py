"""``reference_answer`` and other item fields take every JSON value the services pass on (OpenAI's item
namespace, the Nova/Bedrock Lambda events): numbers, booleans, lists and objects, in datasets and in
``rewards test``; templates render a non-string value as compact JSON. An empty reference is refused."""

from __future__ import annotations

import json

import pytest

from openrft.cli import main
from openrft.data.loader import DatasetError, load_dataset
from tests.rewards.helpers import example, scores

REFERENCES = [1.0, 18, -3.5, True, ["b", "a"], {"final_answer": "72"}, "72"]


def line(reference, **extra) -> str:
    return json.dumps({"messages": [{"role": "user", "content": "q"}], "reference_answer": reference, **extra})


def test_every_json_value_is_a_reference(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(line(r) + "\n" for r in REFERENCES))
    examples = load_dataset(str(path), require_reference=True)
    assert [e.reference_answer for e in examples] == REFERENCES


@pytest.mark.parametrize("empty", ["", "  ", [], {}])
def test_an_empty_reference_is_refused_with_its_line(tmp_path, empty):
    path = tmp_path / "train.jsonl"
    path.write_text(line("1") + "\n" + line(empty) + "\n")
    with pytest.raises(DatasetError) as info:
        load_dataset(str(path))
    [problem] = info.value.problems
    assert (problem.line, problem.field) == (2, "reference_answer") and "is empty" in problem.message


def test_the_graders_guide_item_runs_in_rewards_test(tmp_path, capsys):
    """The graders guide runs a grader on ``item: {"reference_answer": 1.0}`` with ``model_sample: "0.9"``."""
    grader = tmp_path / "grader.json"
    grader.write_text(
        json.dumps(
            {
                "type": "text_similarity",
                "name": "close",
                "input": "{{sample.output_text}}",
                "reference": "{{item.reference_answer}}",
                "evaluation_metric": "fuzzy_match",
            }
        )
    )
    item = tmp_path / "item.json"
    item.write_text(json.dumps({"messages": [{"role": "user", "content": "Score it"}], "reference_answer": 1.0}))
    assert main(["rewards", "test", str(grader), "--example", str(item), "--response", "1.0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 1.0
    assert main(["rewards", "test", str(grader), "--example", str(item), "--response", "0.9", "--json"]) == 0
    assert 0 < json.loads(capsys.readouterr().out)["score"] < 1


@pytest.mark.parametrize(
    ("reference", "rendered"),
    [(1.0, "1.0"), (18, "18"), (True, "true"), (["b", "a"], '["b","a"]'), ({"x": 1}, '{"x":1}'), ("72", "72")],
)
def test_templates_render_non_string_values_as_json(reference, rendered):
    check = {
        "type": "openai_grader",
        "grader": {
            "type": "string_check",
            "name": "eq",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "operation": "eq",
        },
    }
    assert scores(check, [rendered, rendered + " "], example(reference_answer=reference)) == [1.0, 0.0]


def test_item_fields_of_any_type_reach_a_nested_template():
    check = {
        "type": "openai_grader",
        "grader": {
            "type": "string_check",
            "name": "eq",
            "input": "{{sample.output_text}}",
            "reference": "{{item.choices[1]}}/{{item.meta.ok}}",
            "operation": "eq",
        },
    }
    assert scores(check, ["b/false"], example(choices=["a", "b"], meta={"ok": False}, reference_answer=0)) == [1.0]
