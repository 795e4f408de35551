"""The corpus of published reward shapes: each reward (a config, or a Lambda file in rewards/), the example it
is checked on, and the score its source says that example gets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
QUESTION = [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in all?"}]


@dataclass(frozen=True)
class PublishedReward:
    name: str
    source: str
    reward: dict[str, Any] | str  # a reward config, or a Lambda file (rewards/NAME.py) run as published
    example: dict[str, Any]  # one dataset line
    response: str
    score: float
    why: str  # what the source says about this example

    def target(self) -> dict[str, Any] | str:
        return f"{HERE / 'rewards' / self.reward}:lambda_handler" if isinstance(self.reward, str) else self.reward


STRING_CHECK = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "eq",
}
REWARDS = [
    PublishedReward(
        "gsm8k_strict_lambda",
        "github.com/aws-samples/amazon-bedrock-samples: custom-models/bedrock-reinforcement-fine-tuning/"
        "reward-functions/gsm8k_rew_func.py",
        "gsm8k_strict_lambda.py",
        {"id": "g1", "messages": QUESTION, "reference_answer": {"final_answer": "72"}},
        "48 + 24 = 72\n#### 72",
        1.0,
        "the strict method takes the number after '####'; equal to the ground truth scores 1",
    ),
    PublishedReward(
        "gsm8k_strict_lambda, unformatted",
        "as above",
        "gsm8k_strict_lambda.py",
        {"id": "g2", "messages": QUESTION, "reference_answer": {"final_answer": "72"}},
        "The answer is 72.",
        0.0,
        "without '####' the strict method finds no answer: format_score 0",
    ),
    PublishedReward(
        "finqa_tolerance_lambda",
        "github.com/aws-samples/amazon-bedrock-samples: custom-models/bedrock-reinforcement-fine-tuning/"
        "reward-functions/finqa_rew_func.py",
        "finqa_tolerance_lambda.py",
        {"id": "f1", "messages": QUESTION, "reference_answer": {"answer": "66.65"}},
        "Revenue grew by ANSWER: 66.7%",
        0.95,
        "within the absolute tolerance (0.9 for values of 2 or more) but not equal to two decimals: score x 0.95",
    ),
    PublishedReward(
        "metric_keyed_lambda",
        "a Nova/Bedrock Lambda whose optional metrics_list items are {metric, value} (the Nova RFT guide's "
        "output contract: id and aggregate_reward_score required, metrics_list optional)",
        "metric_keyed_lambda.py",
        {"id": "m1", "messages": QUESTION, "reference_answer": 72},
        "72",
        1.0,
        "aggregate_reward_score is the reward; the malformed optional items are dropped with a warning",
    ),
    PublishedReward(
        "graders guide string_check on a numeric item",
        "platform.openai.com/docs/guides/graders (string_check; the guide's run payload item "
        '{"reference_answer": 1.0})',
        {"type": "openai_grader", "grader": STRING_CHECK},
        {"messages": QUESTION, "reference_answer": 1.0},
        "1.0",
        1.0,
        "eq is a case-sensitive equality of input and reference: 1 when they match",
    ),
    PublishedReward(
        "graders guide python grader on a numeric item",
        "platform.openai.com/docs/guides/graders (python grader: grade(sample, item) -> float; run with item "
        '{"reference_answer": 1.0} and model_sample "0.9")',
        {
            "type": "openai_grader",
            "grader": {
                "type": "python",
                "name": "closeness",
                "source": "def grade(sample, item) -> float:\n"
                "    return 1.0 - abs(float(sample['output_text']) - item['reference_answer'])\n",
            },
        },
        {"messages": QUESTION, "reference_answer": 1.0},
        "0.9",
        0.9,
        "the grader's own arithmetic on the item's number: 1 - |0.9 - 1.0|",
    ),
    PublishedReward(
        "graders guide string_check ilike",
        "platform.openai.com/docs/guides/graders (string_check operations)",
        {"type": "openai_grader", "grader": {**STRING_CHECK, "operation": "ilike"}},
        {"messages": QUESTION, "reference_answer": "Paris"},
        "The capital is PARIS.",
        1.0,
        "ilike: the reference is contained in the input, ignoring case",
    ),
    PublishedReward(
        "Vertex code execution",
        "cloud.google.com Vertex AI REST reference, ReinforcementTuningSpec codeExecutionRewardScorer: "
        "evaluate(example, response) with response.get('parts', [])[0]['text']",
        {
            "type": "vertex",
            "single": {
                "rewardName": "exact",
                "codeExecutionRewardScorer": {
                    "pythonCodeSnippet": "def evaluate(example, response):\n"
                    "    text = response.get('parts', [])[0]['text'].strip()\n"
                    "    return 1.0 if text == example['references']['answer'] else -1.0\n"
                },
            },
        },
        {"contents": [{"role": "user", "parts": [{"text": "2+3?"}]}], "references": {"answer": "5"}},
        " 5 ",
        1.0,
        "evaluate's return value is the reward (clipped to [-1, 1])",
    ),
    PublishedReward(
        "Vertex string match with REGEX_EXTRACT",
        "cloud.google.com Vertex AI REST reference: parseResponseConfig REGEX_EXTRACT (the last match) and "
        "stringMatchRewardScorer EXACT_MATCH with {{references.key}}",
        {
            "type": "vertex",
            "single": {
                "rewardName": "answer",
                "parseResponseConfig": {"parseType": "REGEX_EXTRACT", "regexExtractExpression": "answer: (\\d+)"},
                "stringMatchRewardScorer": {
                    "correctAnswerReward": 1,
                    "wrongAnswerReward": -1,
                    "stringMatchExpression": {"matchOperation": "EXACT_MATCH", "expression": "{{references.answer}}"},
                },
            },
        },
        {"contents": [{"role": "user", "parts": [{"text": "2+3?"}]}], "references": {"answer": "5"}},
        "answer: 4, no, answer: 5",
        1.0,
        "the last match is the parsed response; equal to the reference: correctAnswerReward",
    ),
]
