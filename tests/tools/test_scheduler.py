"""Episodes scheduled independently: a fast tool's episode moves on while a slow one is still running."""

from __future__ import annotations

import pytest

from tests.tools.scripted import tool_tokenizer
from tests.tools.test_episodes import Episodes, caller, use

TOOLS = """
import time

def slow(expression):
    time.sleep(0.8)
    return "7"

def fast(expression):
    return "7"
"""


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


def tools(tmp_path, **settings) -> dict:
    path = tmp_path / "latency.py"
    path.write_text(TOOLS)
    functions = {n: {"type": "python", "function": f"{path}:{n}", "sandboxed": False} for n in ("slow", "fast")}
    return {"functions": functions, **settings}


def run(tokenizer, tools: dict, rows, n: int = 1):
    with Episodes(tokenizer, caller, tools, rows) as episodes:
        groups = episodes.run(n=n)
        return groups, episodes.policy.calls


def shape(groups) -> list:
    return [[(c.token_ids, c.loss_mask, c.text, c.finish_reason) for c in group] for group in groups]


def test_an_episode_whose_tool_is_back_is_sampled_before_a_slow_one_returns(tokenizer, tmp_path):
    rows = [use("slow"), use("fast")]
    independent, batches = run(tokenizer, tools(tmp_path), rows, n=2)
    lockstep, lockstep_batches = run(tokenizer, tools(tmp_path, schedule="lockstep"), rows, n=2)
    assert lockstep_batches == [2, 4]  # the fast episodes' answers waited for the slow tool
    assert batches == [2, 2, 2]  # first turns; the fast episodes' answers; then the slow ones'
    assert shape(independent) == shape(lockstep)  # the same episodes, token for token
    assert [c.text for group in independent for c in group] == ["7"] * 4


def test_prompts_past_the_cap_start_as_running_episodes_end(tokenizer, tmp_path):
    rows = [use("fast"), use("slow"), use("fast")]
    groups, batches = run(tokenizer, tools(tmp_path, max_episodes_in_flight=1), rows)
    assert batches == [1, 1, 1, 1, 1, 1]  # never more than one episode in a batch
    assert [c.text for (c,) in groups] == ["7", "7", "7"]
    assert all(c.metadata["tools"]["calls"] for (c,) in groups)
