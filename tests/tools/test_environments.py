"""The environment contract (rows by what they are, reset before the first turn with an opening observation,
steps that end an episode or reward a turn, close always, the final reward sees the conversation and the
state) and failures that stay with their input (the breaker, malformed calls, long outputs, too many calls,
in-process timeouts)."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from openrft.data.records import Example
from openrft.errors import RewardError
from tests.tools.scripted import CALCULATOR_TOOL, call, question, tool_tokenizer
from tests.tools.test_episodes import IN_PROCESS, Episodes, ToolServer, caller, tool_server, use  # noqa: F401

ENVIRONMENT = r"""
import json
from openrft.tools.runners import Step

def log(*event):
    with open(__file__ + ".log", "a") as f:
        f.write(json.dumps(event) + "\n")


class Vault:
    def __init__(self, config):
        self.config = config

    def reset(self, row):
        self.secret, self.row_id, self.opened = row["secret"], row["id"], 0
        log("reset", row["id"])
        if row["id"] == "broken":
            raise RuntimeError("no vault for this row")
        return "The vault has a lock." if self.config.get("observe") else None

    def step(self, name, arguments):
        self.opened += 1
        if arguments.get("expression") == "open":
            return Step(f"the secret is {self.secret}", done=True, reward=0.25)
        return Step(f"locked ({self.opened})", reward=0.5)

    def reward(self, messages):
        self.seen = [m["role"] for m in messages]
        return None if self.config.get("defer") else float(len(messages))

    def state(self):
        return {"row": self.row_id, "opened": self.opened, "seen": self.seen}

    def close(self):
        log("close", self.row_id)
        if self.row_id == "shaky":
            raise OSError("close failed")
"""


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


def vault_row(id: str, secret: str) -> Example:
    """Rows with the SAME prompt and different hidden state."""
    return Example(
        id=id,
        messages=[{"role": "user", "content": "Open the vault."}],
        fields={"secret": secret, "reference_answer": secret},
        tools=[CALCULATOR_TOOL],
    )


def vault_tools(tmp_path, **config) -> dict:
    (tmp_path / "vault_env.py").write_text(ENVIRONMENT)
    return {"environment": {"module": str(tmp_path / "vault_env.py"), "class_name": "Vault", "config": config}}


def events(tmp_path) -> list:
    return [tuple(json.loads(line)) for line in (tmp_path / "vault_env.py.log").read_text().splitlines()]


def opener(context: str) -> str:
    """Knocks once, then opens; answers with the secret once it has it."""
    if "the secret is" in context:
        return context.rsplit("the secret is ", 1)[1].split("<")[0]
    return call("open") if "locked" in context else call("knock")


def test_rows_with_the_same_prompt_keep_their_own_state(tokenizer, tmp_path):
    rows = [vault_row("a", "111"), vault_row("b", "222"), vault_row("c", "333")]
    with Episodes(tokenizer, opener, vault_tools(tmp_path, defer=True), rows) as episodes:
        assert episodes.prompts[0] == episodes.prompts[1] == episodes.prompts[2]
        groups = episodes.run(n=2)
        outcomes = episodes.score(groups)
    for row, group in zip(rows, groups):
        for completion in group:
            assert completion.turns[-1]["content"] == f"the secret is {row.fields['secret']}"
            assert completion.metadata["environment_state"]["row"] == row.id
    assert [o.score for o in outcomes] == [0.0] * 6  # the final answers are never read after `done`
    ids = {c.metadata["episode_id"] for g in groups for c in g}
    assert len(ids) == 6


def test_reset_opens_the_conversation_and_a_step_can_end_it_with_turn_rewards(tokenizer, tmp_path):
    seen = []

    def policy(context: str) -> str:
        seen.append(context)
        return opener(context)

    with Episodes(tokenizer, policy, vault_tools(tmp_path, observe=True), [vault_row("a", "111")]) as episodes:
        ((completion,),) = episodes.run()
        (plain,) = episodes.score([[completion]])
    # the opening observation was in the model's first context, after the row's messages
    assert (
        "Open the vault.<|im_end|>\n<|im_start|>user\nThe vault has a lock.<|im_end|>\n<|im_start|>assistant\n"
        in seen[0]
    )
    assert completion.prompt_ids != episodes.prompts[0]  # the episode's own prompt
    roles = [m["role"] for m in completion.turns]
    assert roles == ["user", "assistant", "tool", "assistant", "tool"]  # ended by the step: no third turn
    assert completion.finish_reason == "stop" and len(seen) == 2
    assert completion.metadata["tools"]["environment_done"] is True
    assert completion.metadata["turn_rewards"] == [0.5, 0.25]
    # the final reward saw every message: prompt, observation, two calls and their results
    assert completion.metadata["environment_state"]["seen"] == [
        "user",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert plain.score == 6.0 and plain.sub_scores == {"environment": 6.0}  # turn rewards ignored by default


def test_turn_rewards_summed_into_the_episode_return(tokenizer, tmp_path):
    import asyncio

    from openrft.engine.rollouts import reward_samples
    from openrft.rewards import build_reward
    from openrft.rewards.episodes import EpisodeReward
    from openrft.spec.rewards import RewardSpec

    with Episodes(tokenizer, opener, vault_tools(tmp_path), [vault_row("a", "111")]) as episodes:
        groups = episodes.run()
    spec = RewardSpec.model_validate({"function": {"type": "preset", "name": "exact_match"}})
    function = EpisodeReward(build_reward(spec), turn_rewards="sum")
    (outcome,) = asyncio.run(function.score(reward_samples(episodes.examples, groups, step=1)))
    assert outcome.score == 5.0 + 0.75 and outcome.sub_scores["turns"] == 0.75 and outcome.sub_scores["episode"] == 5.0


def test_close_is_always_called_even_when_reset_fails(tokenizer, tmp_path):
    rows = [vault_row("broken", "0"), vault_row("shaky", "1"), vault_row("ok", "2")]
    with Episodes(tokenizer, opener, vault_tools(tmp_path), rows) as episodes:
        broken, shaky, ok = (g[0] for g in episodes.run())
    log = events(tmp_path)
    assert sorted(e for e in log if e[0] == "close") == [("close", "broken"), ("close", "ok"), ("close", "shaky")]
    assert broken.finish_reason == "tool_error" and broken.token_ids == []
    assert broken.metadata["tool_failure"] == [
        "runtime_error",
        "environment reset: RuntimeError: no vault for this row",
    ]
    assert shaky.metadata["tools"]["close_error"] == "environment close: OSError: close failed"
    assert ok.metadata["tools"]["close_error"] is None and ok.finish_reason == "stop"


def test_http_tools_get_the_episode_id_and_the_turn(tokenizer, tool_server):  # noqa: F811
    def twice(context: str) -> str:
        return call("3+4", "add") if context.count("<tool_response>") < 2 else "7"

    tools = {"functions": {"add": {"type": "http", "url": f"{tool_server}/add"}}}
    with Episodes(tokenizer, twice, tools, [use("add")]) as episodes:
        groups = episodes.run(n=2)
    sent = [s for s in ToolServer.seen if s["path"] == "/add"]
    assert sorted((s["turn"], s["call_id"]) for s in sent) == [(1, "call01000")] * 2 + [(2, "call02000")] * 2
    by_episode = {}
    for s in sent:
        by_episode.setdefault(s["episode_id"], []).append(s["turn"])
    assert sorted(by_episode.values()) == [[1, 2], [1, 2]]  # one id per episode, both turns under it
    assert set(by_episode) == {c.metadata["episode_id"] for c in groups[0]}


def test_a_row_whose_tool_always_fails_does_not_end_the_job(tokenizer, tool_server):  # noqa: F811
    remote = {"timeout_s": 2, "max_retries": 0, "circuit_failures": 2}
    tools = {
        "functions": {n: {"type": "http", "url": f"{tool_server}/{n}", "remote": remote} for n in ("broken", "add")}
    }
    with Episodes(tokenizer, caller, tools, [use("broken"), use("add")]) as episodes:
        broken, add = episodes.run(n=8)  # 8 failures in a row from one row: that row's errors
    assert all(c.metadata["tool_failure"][0] == "server_error" for c in broken)
    assert all(c.text == "7" for c in add)


def test_an_endpoint_down_for_every_row_ends_the_job_naming_the_tool(tokenizer, tool_server):  # noqa: F811
    remote = {"timeout_s": 2, "max_retries": 0, "circuit_failures": 3}
    tools = {"functions": {"broken": {"type": "http", "url": f"{tool_server}/broken", "remote": remote}}}
    rows = [Example(id=f"r{i}", messages=use("broken").messages, tools=use("broken").tools) for i in range(4)]
    with Episodes(tokenizer, caller, tools, rows) as episodes, pytest.raises(RewardError) as error:
        episodes.run()
    # 3 failures trip it; the episodes' calls run concurrently, so the fourth may have failed by then
    assert "endpoint of tool broken" in str(error.value)
    assert re.search(r"for [34] different inputs", str(error.value)), str(error.value)
    assert "reward endpoint" not in str(error.value)


def test_a_malformed_call_is_answered_and_the_model_goes_on(tokenizer):
    def policy(context: str) -> str:
        if "could not be read" not in context:
            return '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"</tool_call>'
        if "<tool_response>6</tool_response>" not in context:
            return call("2*3")
        return "6"

    with Episodes(tokenizer, policy, IN_PROCESS, [question(2, 3)]) as episodes:
        ((completion,),) = episodes.run(budget=600)
        (outcome,) = episodes.score([[completion]])
    assert completion.text == "6" and outcome.score == 1.0
    refused = completion.turns[0]["tool_calls"][0]
    assert refused["function"]["name"] == "calculator" and refused["function"]["arguments"].startswith("<tool_call>")
    assert completion.turns[1]["content"].startswith("error: the tool call could not be read")
    stats = completion.metadata["tools"]
    assert stats["malformed"] == 1 and stats["calls"] == {"calculator": 1}  # the broken block was not run

    silent = {**IN_PROCESS, "malformed_call_message": None}
    with Episodes(tokenizer, policy, silent, [question(2, 3)]) as episodes:
        ((completion,),) = episodes.run()
    assert completion.turns[-1]["role"] == "assistant" and len(completion.turns) == 1  # the old way: the answer


def test_long_outputs_are_cut_and_calls_past_the_cap_are_refused(tokenizer, tmp_path):
    (tmp_path / "talk.py").write_text("def talk(expression):\n    return 'x' * 5000\n")
    tools = {
        "max_output_chars": 300,
        "max_calls_per_turn": 2,
        "functions": {"calculator": {"type": "python", "function": f"{tmp_path / 'talk.py'}:talk", "sandboxed": False}},
    }

    def policy(context: str) -> str:
        return call("1") + call("2") + call("3") if "<tool_response>" not in context else "done"

    with Episodes(tokenizer, policy, tools, [question(2, 3)]) as episodes:
        ((completion,),) = episodes.run(budget=2000)
    results = [m["content"] for m in completion.turns if m["role"] == "tool"]
    assert len(results[0]) == len(results[1]) == 300 and results[0].startswith("x" * 200)
    assert re.search(r"\n\[truncated: 5,000 characters, the first \d+ shown\]$", results[0])
    assert results[2] == "error: at most 2 tool calls run per turn; this one did not"
    assert completion.metadata["tools"]["calls"] == {"calculator": 2} and completion.metadata["tools"]["rejected"] == 1


def test_an_in_process_tool_past_its_time_limit_leaves_no_thread(tokenizer, tmp_path):
    (tmp_path / "spin.py").write_text("def spin(expression):\n    while True:\n        pass\n")
    tools = {
        "functions": {
            "calculator": {
                "type": "python",
                "function": f"{tmp_path / 'spin.py'}:spin",
                "sandboxed": False,
                "timeout_s": 0.3,
            }
        }
    }
    before = threading.active_count()
    with Episodes(tokenizer, lambda context: call("1"), tools, [question(2, 3)]) as episodes:
        ((completion,),) = episodes.run()
    assert completion.metadata["tool_failure"][0] == "timeout"
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before
    assert not any(t.name == "openrft-tool-call" for t in threading.enumerate())


def test_step_results_that_are_json_values_stay_json(tokenizer, tmp_path):
    (tmp_path / "plain_env.py").write_text(
        "class Env:\n    def __init__(self, config): pass\n    def step(self, name, arguments): return {'ok': True}\n"
    )
    tools = {"environment": {"module": str(tmp_path / "plain_env.py"), "class_name": "Env"}}
    with Episodes(tokenizer, lambda c: call("1") if "<tool_response>" not in c else "ok", tools, [question(1, 2)]) as e:
        ((completion,),) = e.run()
    assert json.loads(completion.turns[1]["content"]) == {"ok": True} and "turn_rewards" not in completion.metadata
