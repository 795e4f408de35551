"""LLM judges against a real OpenAI-compatible server on 127.0.0.1 running the demo model."""

import pytest

from openrft.rewards.judge import parse_label, parse_score
from openrft.rewards.types import RewardFailure
from tests.rewards.chat_server import ChatServer, DemoChatModel
from tests.rewards.helpers import example, score


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("7", 7.0),
        (" 0.25\n", 0.25),
        ('{"result": 0.8, "steps": []}', 0.8),
        ('```json\n{"score": 3}\n```', 3.0),
        ("Reasoning... Score: 4", 4.0),
        ("<think>maybe 9</think>6", 6.0),
        ("rating = -1.5", -1.5),
    ],
)
def test_parse_score(reply, expected):
    assert parse_score(reply) == expected


@pytest.mark.parametrize("reply", ["", "great answer", "3 apples and 4 pears", '{"score": "high"}'])
def test_unparseable_scores_are_parse_errors(reply):
    with pytest.raises(RewardFailure) as info:
        parse_score(reply)
    assert info.value.kind == "parse_error"


def test_parse_label():
    labels = ["correct", "incorrect"]
    assert parse_label("Correct.", labels) == "correct"
    assert parse_label('{"result": "incorrect"}', labels) == "incorrect"
    assert parse_label("I judge this answer to be incorrect", labels) == "incorrect"
    with pytest.raises(RewardFailure, match="none \\(or several\\)"):
        parse_label("correct or incorrect?", labels)


@pytest.fixture(scope="module")
def chat():
    model = DemoChatModel()
    with ChatServer(model) as server:
        yield server


QUESTION = example(question="What is 2+3?", reference_answer="5", references={"ground_truth_answer": "5"})


def expected_score(chat, prompt, low, high):
    reply = chat.model.reply([{"role": "user", "content": prompt}], 16)
    try:
        return min(high, max(low, parse_score(reply)))
    except RewardFailure:
        return "parse_error"


def test_score_model_grader_through_the_server(chat, monkeypatch):
    monkeypatch.setenv("OPENRFT_JUDGE_API_KEY", "sk-test")
    grader = {
        "type": "openai_grader",
        "grader": {
            "type": "score_model",
            "name": "judge",
            "model": "gpt-4o-judge",
            "range": [0, 100],
            "input": [{"role": "user", "content": "{{item.question}}"}],
        },
    }
    outcome = score(grader, ["anything"], QUESTION, judge={"base_url": chat.base_url})[0]
    expected = expected_score(chat, "What is 2+3?", 0, 100)
    assert (outcome.score if outcome.ok else outcome.error_kind) == expected
    request = chat.requests[-1]
    assert request["body"]["model"] == "gpt-4o-judge"
    assert request["body"]["messages"] == [{"role": "user", "content": "What is 2+3?"}]
    assert request["authorization"] == "Bearer sk-test"


def test_label_model_reply_without_a_label_is_a_parse_error(chat):
    grader = {
        "type": "openai_grader",
        "grader": {
            "type": "label_model",
            "name": "judge",
            "model": "m",
            "labels": ["yes", "no"],
            "passing_labels": ["yes"],
            "input": [{"role": "user", "content": "{{item.question}}"}],
        },
    }
    outcome = score(grader, ["x"], QUESTION, judge={"base_url": chat.base_url, "model": "local-demo"})[0]
    assert outcome.error_kind == "parse_error" and outcome.score is None  # the demo model answers digits
    assert chat.requests[-1]["body"]["model"] == "local-demo"


def test_vertex_autorater_averages_its_samples(chat, monkeypatch):
    monkeypatch.setenv("OPENRFT_JUDGE_BASE_URL", chat.base_url)
    before = len(chat.requests)
    config = {
        "type": "vertex",
        "single": {
            "rewardName": "judge",
            "autoraterScorer": {
                "autoraterConfig": {"autoraterModel": "gemini-judge", "samplingCount": 3},
                "autoraterPrompt": "{{prompt}}",
            },
        },
    }
    outcome = score(config, ["resp"], QUESTION)[0]
    expected = expected_score(chat, "What is 2+3?", -1, 1)
    assert (outcome.score if outcome.ok else outcome.error_kind) == expected
    assert len(chat.requests) - before == 3


def test_autorater_exact_match_scorer(chat):
    reply = chat.model.reply([{"role": "user", "content": "What is 2+3?"}], 16).strip()
    config = {
        "type": "vertex",
        "single": {
            "autoraterScorer": {
                "autoraterConfig": {"samplingCount": 1},
                "autoraterPrompt": "{{prompt}}",
                "exactMatchScorer": {"expression": reply, "correctAnswerReward": 1, "wrongAnswerReward": -1},
            }
        },
    }
    assert score(config, ["x"], QUESTION, judge={"base_url": chat.base_url})[0].score == 1.0


def test_judge_without_an_endpoint_is_a_config_error(monkeypatch):
    from openrft.spec.errors import SpecError

    for name in ("OPENRFT_JUDGE_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    grader = {
        "type": "openai_grader",
        "grader": {"type": "score_model", "name": "j", "model": "m", "input": [{"role": "user", "content": "hi"}]},
    }
    with pytest.raises(SpecError, match="LLM judge but no endpoint is set"):
        score(grader, ["x"])


def score_grader(**extra):
    grader = {
        "type": "score_model",
        "model": "gpt-4.1-2025-04-14",
        "input": [{"role": "user", "content": "{{item.question}} {{sample.output_text}}"}],
        **extra,
    }
    return {"type": "openai_grader", "grader": grader}


def test_score_model_asks_for_openais_structured_output(chat):
    chat.refuse_response_format = False
    outcome = score(score_grader(), ["5"], QUESTION, judge={"base_url": chat.base_url})[0]
    body = chat.requests[-1]["body"]
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert schema["required"] == ["steps", "result"] and schema["properties"]["result"] == {"type": "number"}
    assert schema["properties"]["steps"]["items"]["required"] == ["description", "conclusion"]
    assert (outcome.score if outcome.ok else outcome.error_kind) == expected_score(chat, "What is 2+3? 5", 0, 1)


def test_label_model_schema_lists_the_labels(chat):
    chat.refuse_response_format = False
    grader = {
        "type": "openai_grader",
        "grader": {
            "type": "label_model",
            "model": "m",
            "labels": ["yes", "no"],
            "passing_labels": ["yes"],
            "input": [{"role": "user", "content": "{{item.question}}"}],
        },
    }
    score(grader, ["x"], QUESTION, judge={"base_url": chat.base_url})
    result = chat.requests[-1]["body"]["response_format"]["json_schema"]["schema"]["properties"]["result"]
    assert result == {"type": "string", "enum": ["yes", "no"]}


def test_endpoint_without_structured_output_is_asked_again_without_it(chat):
    chat.refuse_response_format = True
    try:
        before = len(chat.requests)
        outcomes = score(score_grader(), ["5", "6"], QUESTION, judge={"base_url": chat.base_url, "max_concurrency": 1})
        sent = [r["body"] for r in chat.requests[before:]]
    finally:
        chat.refuse_response_format = False
    # the first request is refused (400) and sent again without response_format; the second goes without it
    assert ["response_format" in b for b in sent] == [True, False, False]
    expected = [expected_score(chat, f"What is 2+3? {t}", 0, 1) for t in ("5", "6")]
    assert [o.score if o.ok else o.error_kind for o in outcomes] == expected


def test_structured_output_can_be_turned_off(chat):
    score(score_grader(), ["5"], QUESTION, judge={"base_url": chat.base_url, "structured_output": False})
    assert "response_format" not in chat.requests[-1]["body"]


def test_vertex_parsed_response_conversion_scorer(chat):
    reply = chat.model.reply([{"role": "user", "content": "What is 2+3?"}], 16)
    config = {
        "type": "vertex",
        "single": {
            "autoraterScorer": {
                "autoraterConfig": {"samplingCount": 1},
                "autoraterPrompt": "{{prompt}}",
                "autoraterResponseParseConfig": {"parseType": "REGEX_EXTRACT", "regexExtractExpression": r"(-?\d+)"},
                "parsedResponseConversionScorer": {},
            }
        },
    }
    outcome = score(config, ["x"], QUESTION, judge={"base_url": chat.base_url})[0]
    import re

    numbers = re.findall(r"-?\d+", reply)
    if numbers:  # the last number of the judge's reply, as a float, clipped to [-1, 1]
        assert outcome.score == max(-1.0, min(1.0, float(numbers[-1])))
    else:
        assert outcome.error_kind == "parse_error"
    assert "response_format" not in chat.requests[-1]["body"]  # Vertex autoraters parse their own replies
