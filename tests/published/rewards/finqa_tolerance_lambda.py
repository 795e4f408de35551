"""OpenRFT's own reward Lambda in the shape of aws-samples' FinQA reward function for Bedrock RFT: the
reference at the top level (``reference_answer.answer``), the last message the model's, ``ANSWER: <number>``
read with a percent sign, 1.0 for an exact match to two decimals, 0.95 within a small tolerance."""

import re
from dataclasses import asdict, dataclass


@dataclass
class RewardOutput:
    id: str
    aggregate_reward_score: float


def number(text):
    match = re.search(r"ANSWER:\s*[\[\*]*([\d,.-]+%?)", text, re.IGNORECASE)
    if not match:
        return None
    try:
        return float(match.group(1).replace(",", "").replace("%", ""))
    except ValueError:
        return None


def score(text, reference):
    expected = float(str(reference.get("answer", reference)).replace("%", ""))
    got = number(text)
    if got is None:
        return 0.0
    if round(got, 2) == round(expected, 2):
        return 1.0
    tolerance = 0.1 if abs(expected) < 2 else 0.9
    return 0.95 if abs(round(got, 2) - round(expected, 2)) < tolerance else 0.0


def lambda_handler(event, context):
    out = []
    for sample in event:
        last = sample["messages"][-1]
        value = score(last["content"], sample["reference_answer"]) if last["role"] == "assistant" else 0.0
        out.append(RewardOutput(id=sample["id"], aggregate_reward_score=value))
    return [asdict(o) for o in out]
