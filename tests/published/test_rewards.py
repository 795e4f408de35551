"""Every reward of the corpus scores its published example as its source says, run as a user runs it:
``openrft rewards test`` with the config or the published Lambda file."""

from __future__ import annotations

import json

import pytest

from openrft.cli import main
from tests.published.rewards import REWARDS
from tests.rewards.helpers import require_bwrap


@pytest.mark.parametrize("reward", REWARDS, ids=[r.name for r in REWARDS])
def test_a_published_reward_scores_its_example_as_its_source_says(reward, tmp_path, capsys):
    target = reward.target()
    if not isinstance(target, dict) or target.get("grader", {}).get("type") == "python" or "single" in target:
        require_bwrap()  # user code runs in the sandbox
    if isinstance(target, dict):
        path = tmp_path / "reward.json"
        path.write_text(json.dumps({"function": target}))
        target = str(path)
    line = tmp_path / "example.json"
    line.write_text(json.dumps(reward.example))
    code = main(["rewards", "test", target, "--example", str(line), "--response", reward.response, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["score"] == pytest.approx(reward.score), reward.why
