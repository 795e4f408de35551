"""Vertex rewards against hand-computed scores."""

import pytest

from tests.rewards.helpers import example, score, scores

GT = "{{references.ground_truth_answer}}"
EX = example(references={"ground_truth_answer": "391", "unit": "km"})


def single(match=None, parse=None, json_key=None, correct=1.0, wrong=0.0):
    scorer = {"correctAnswerReward": correct, "wrongAnswerReward": wrong}
    expression = {"matchOperation": match or "EXACT_MATCH", "expression": GT}
    if json_key:
        scorer["jsonMatchExpression"] = {"keyName": json_key, "valueStringMatchExpression": expression}
    else:
        scorer["stringMatchExpression"] = expression
    config = {"rewardName": "correct", "stringMatchRewardScorer": scorer}
    if parse:
        config["parseResponseConfig"] = {"parseType": "REGEX_EXTRACT", "regexExtractExpression": parse}
    return {"type": "vertex", "single": config}


def test_exact_match_trims_but_keeps_case_and_inner_text():
    assert scores(single(), ["391", "  391\n", "391.", "The answer is 391", ""], EX) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_partial_match_and_regex_contains():
    assert scores(single("PARTIAL_MATCH"), ["The answer is 391", "39 1", "3910"], EX) == [1.0, 0.0, 1.0]
    regex = {
        "type": "vertex",
        "single": {
            "stringMatchRewardScorer": {
                "stringMatchExpression": {
                    "matchOperation": "REGEX_CONTAINS",
                    "expression": r"\b{{references.ground_truth_answer}}\b",
                }
            }
        },
    }
    assert scores(regex, ["it is 391 km", "3910", "x391"], EX) == [1.0, 0.0, 0.0]


def test_regex_placeholder_values_are_escaped():
    ex = example(references={"ground_truth_answer": "3.5"})
    regex = {
        "type": "vertex",
        "single": {
            "stringMatchRewardScorer": {"stringMatchExpression": {"matchOperation": "REGEX_CONTAINS", "expression": GT}}
        },
    }
    assert scores(regex, ["3.5", "315"], ex) == [1.0, 0.0]


def test_regex_extract_takes_the_last_match_and_no_match_is_a_wrong_answer():
    outcomes = score(
        single(parse=r"answer: (\d+)", wrong=-1.0),
        ["answer: 12 ... answer: 391", "answer: 391 ... answer: 12", "I do not know"],
        EX,
    )
    assert [o.score for o in outcomes] == [1.0, -1.0, -1.0]
    assert [o.metrics["parse_failed"] for o in outcomes] == [0.0, 0.0, 1.0]
    assert all(o.ok for o in outcomes)


def test_regex_without_group_uses_the_whole_match():
    assert scores(single(parse=r"\d+"), ["1 2 391", "391 2"], EX) == [1.0, 0.0]


def test_json_match_expression():
    outcomes = score(
        single(json_key="answer"),
        [
            '{"answer": "391"}',
            '{"answer": 391}',
            '{"answer": "392"}',
            '{"other": "391"}',
            '{"answer": "391"',
            '["391"]',
        ],
        EX,
    )
    assert [o.score for o in outcomes] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert [o.metrics["parse_failed"] for o in outcomes] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]


def test_unicode_and_missing_reference():
    ex = example(references={"ground_truth_answer": "日本語 ✓"})
    assert scores(single(), ["日本語 ✓", "日本語"], ex) == [1.0, 0.0]
    outcome = score(single(), ["391"], example(references={}))[0]
    assert outcome.error_kind == "invalid_output"
    assert "references.ground_truth_answer" in outcome.error_message


def test_rewards_are_clipped_to_minus_one_one():
    assert scores(single(correct=5.0, wrong=-3.0), ["391", "0"], EX) == [1.0, -1.0]


def test_composite_is_the_weighted_mean_of_clipped_rewards():
    composite = {
        "type": "vertex",
        "composite": {
            "weightedRewardConfigs": [
                {
                    "weight": 3,
                    "rewardConfig": {
                        "rewardName": "correct",
                        "stringMatchRewardScorer": {
                            "correctAnswerReward": 2.0,
                            "stringMatchExpression": {"matchOperation": "PARTIAL_MATCH", "expression": GT},
                        },
                    },
                },
                {
                    "weight": 1,
                    "rewardConfig": {
                        "rewardName": "has_unit",
                        "stringMatchRewardScorer": {
                            "wrongAnswerReward": -0.5,
                            "stringMatchExpression": {
                                "matchOperation": "PARTIAL_MATCH",
                                "expression": "{{references.unit}}",
                            },
                        },
                    },
                },
            ]
        },
    }
    outcomes = score(composite, ["391 km", "391", "km", "nothing"], EX)
    # correct is clipped from 2.0 to 1.0 before weighting
    assert [o.score for o in outcomes] == pytest.approx([1.0, (3 * 1 - 0.5) / 4, (0 + 1) / 4, (0 - 0.5) / 4])
    assert outcomes[1].sub_scores == {"correct": 1.0, "has_unit": -0.5}


def test_code_execution_reward_runs_evaluate_in_the_sandbox():
    from tests.rewards.helpers import require_bwrap

    require_bwrap()
    code = {
        "type": "vertex",
        "single": {
            "parseResponseConfig": {"parseType": "REGEX_EXTRACT", "regexExtractExpression": r"answer: (\S+)"},
            "codeExecutionRewardScorer": {
                "pythonCodeSnippet": (
                    "def evaluate(example, response):\n"
                    "    truth = example['references']['ground_truth_answer']\n"
                    "    text = example['contents'][0]['parts'][0]['text']\n"
                    "    return 3.0 if response == truth and text == 'What is 2+3?' else -0.25\n"
                )
            },
        },
    }
    assert scores(code, ["answer: 391", "answer: 390", "nope"], EX) == [1.0, -0.25, -0.25]


def code_execution(snippet: str, parse: str | None = None) -> dict:
    config: dict = {"rewardName": "code", "codeExecutionRewardScorer": {"pythonCodeSnippet": snippet}}
    if parse:
        config["parseResponseConfig"] = {"parseType": "REGEX_EXTRACT", "regexExtractExpression": parse}
    return {"type": "vertex", "single": config}


VERTEX_LINE = example(
    messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 17*23?"}],
    references={"ground_truth_answer": "391"},
)


@pytest.mark.parametrize(
    "body",
    [
        # the REST reference's style: response is a Content object
        'text = response.get("parts", [])[0]["text"]',
        'text = response.get("parts")[0]["text"]',
        'text = response["parts"][0]["text"]',
        'text = "".join(p["text"] for p in response["parts"]) if response.get("role") == "model" else None',
        'text = response["parts"][0]["text"] if "parts" in response else None',
        # snippets written against the parsed text keep working
        "text = response",
        "text = response.strip()",
        "text = str(response)[: len(response)]",
    ],
)
def test_code_execution_response_is_a_content_object_and_the_text(body):
    from tests.rewards.helpers import require_bwrap

    require_bwrap()
    snippet = (
        "def evaluate(example, response):\n"
        f"    {body}\n"
        "    references = example.get('references', {})\n"
        "    assert example['systemInstruction']['parts'][0]['text'] == 'Be brief.'\n"
        "    assert example['contents'][0] == {'role': 'user', 'parts': [{'text': 'What is 17*23?'}]}\n"
        "    return 1.0 if text == references.get('ground_truth_answer') else -1.0\n"
    )
    assert scores(code_execution(snippet, r"answer: (\d+)"), ["answer: 391", "answer: 390"], VERTEX_LINE) == [
        1.0,
        -1.0,
    ]


def test_code_execution_output_is_captured_apart_from_the_score():
    from tests.rewards.helpers import require_bwrap

    require_bwrap()
    snippet = (
        "def evaluate(example, response):\n    print('checking', response.get('parts')[0]['text'])\n    return 1.0\n"
    )
    outcome = score(code_execution(snippet), ["391"], VERTEX_LINE)[0]
    assert outcome.score == 1.0 and outcome.stdout == "checking 391\n"
    failing = "def evaluate(example, response):\n    print('about to fail')\n    raise ValueError('no')\n"
    outcome = score(code_execution(failing), ["391"], VERTEX_LINE)[0]
    assert outcome.error_kind == "runtime_error" and outcome.stdout == "about to fail\n"


def test_script_style_snippets_of_googles_sdk_set_reward():
    from tests.rewards.helpers import require_bwrap

    require_bwrap()
    line = example(references={"reference": "hello"})
    snippet = "reward = 1.0 if response == references['reference'] else 0.0"
    assert scores(code_execution(snippet), ["hello", "print('hello')"], line) == [1.0, 0.0]
    assert scores(code_execution("reward = 1.0"), ["anything"], line) == [1.0]
    content_style = (
        "text = response.get('parts')[0]['text']\nreward = -1.0 if example['references']['reference'] in text else 1"
    )
    assert scores(code_execution(content_style), ["hello", "bye"], line) == [-1.0, 1.0]


def test_a_snippet_without_evaluate_or_reward_is_refused_at_validation():
    from openrft.spec.errors import SpecError

    with pytest.raises(SpecError, match=r"defines no top-level function evaluate\(\) \(nor sets reward\)"):
        score(code_execution("score = 1.0"), ["x"])
