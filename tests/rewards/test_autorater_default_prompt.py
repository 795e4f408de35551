"""A Vertex autorater with only ``autoraterModel``, as Google's SDK sends it (python-genai's
``test_tune_reinforcement`` and ``test_validate_reward_single_autorater``): it validates, in a reward file
and in a Vertex job, and scores with OpenRFT's default judge prompt against a judge server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from openrft.rewards.kinds.vertex import default_autorater_prompt
from openrft.spec.dialects import resolve_document
from tests.rewards.chat_server import ChatServer
from tests.rewards.helpers import example, score
from tests.spec.dialect_builders import Sizes, vertex_request

SDK_SCORER = {"autoraterScorer": {"autoraterConfig": {"autoraterModel": "test-model"}}}


class FixedJudge:
    """A judge that answers every request with the same reply."""

    def __init__(self, reply: str):
        self.answer = reply

    def reply(self, messages: list[dict], max_tokens: int) -> str:
        return self.answer


@pytest.fixture
def judge(monkeypatch):
    with ChatServer(FixedJudge("0.75")) as server:
        monkeypatch.setenv("OPENRFT_JUDGE_BASE_URL", server.base_url)
        yield server


def test_an_autorater_without_a_prompt_scores_with_the_default_prompt(judge):
    question = example(
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+3?"}],
        references={"reference": "5"},
    )
    outcome = score({"type": "vertex", "single": SDK_SCORER}, ["It is 5."], question)[0]
    assert outcome.ok and outcome.score == 0.75
    sent = judge.requests[-4:]  # samplingCount's default, 4 replies averaged
    assert len(judge.requests) == 4
    assert {r["body"]["model"] for r in sent} == {"test-model"}
    prompt = sent[0]["body"]["messages"][0]["content"]
    assert prompt == default_autorater_prompt(question, "It is 5.")
    for part in ("Answer briefly.", "What is 2+3?", "It is 5.", "- reference: 5", "a number from 0 to 1"):
        assert part in prompt


def test_the_default_prompt_without_references_asks_about_the_prompt_only():
    prompt = default_autorater_prompt(example(), "x")
    assert "Reference information" not in prompt and "(none)" in prompt  # no system instruction either


def test_a_vertex_job_in_the_sdks_shape_validates():
    for reward in (
        {"singleRewardConfig": SDK_SCORER},
        {"compositeRewardConfig": {"weightedRewardConfigs": [{"weight": 1.0, "rewardConfig": SDK_SCORER}]}},
    ):
        doc = vertex_request()
        doc["reinforcementTuningSpec"].pop("singleRewardConfig", None)
        doc["reinforcementTuningSpec"] |= reward
        r = resolve_document(doc, base_dir=Path("/jobs"), dataset_size=Sizes(100, 10))
        assert r.spec.reward.function.type == "vertex"
        warned = [w for w in r.warnings if w.path.endswith("autoraterScorer.autoraterPrompt")]
        assert len(warned) == 1 and "OpenRFT's default prompt" in warned[0].message
