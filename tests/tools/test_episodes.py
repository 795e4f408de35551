"""Multi-turn episodes: a scripted policy (its choices) with the real chat template, tools and rewards."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from openrft.data.records import Example
from openrft.engine.rollouts import reward_samples
from openrft.rewards import build_reward
from openrft.rewards.episodes import EpisodeReward
from openrft.rewards.kinds.nova_lambda import nova_entry
from openrft.rollout.prompts import chat_text
from openrft.rollout.types import SamplingParams
from openrft.spec.rewards import RewardSpec, SandboxSpec
from openrft.spec.tools import ToolsSpec
from openrft.tools.episodes import ToolGenerator, ToolService, row_prompts, template_arguments
from openrft.tools.metrics import tool_metrics
from tests.rewards.helpers import require_bwrap
from tests.tools.scripted import (
    ROOT,
    TURN_LOGP,
    ScriptedGenerator,
    calculator_user,
    call,
    prompts_of,
    question,
    tool_tokenizer,
)

CALCULATOR = ROOT / "examples" / "calculator" / "calculator.py"
IN_PROCESS = {
    "functions": {"calculator": {"type": "python", "function": f"{CALCULATOR}:calculator", "sandboxed": False}}
}


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


class Episodes:
    """A ToolGenerator over a scripted policy, with its ToolService closed at the end."""

    def __init__(self, tokenizer, policy, tools: dict, examples: list[Example], sandbox: SandboxSpec | None = None):
        self.tokenizer = tokenizer
        self.service = ToolService(ToolsSpec.model_validate(tools), sandbox or SandboxSpec(isolation="weak"))
        self.policy = ScriptedGenerator(tokenizer, policy)
        self.examples = examples
        self.prompts = row_prompts(examples, prompts_of(tokenizer, examples))
        self.generator = ToolGenerator(self.policy, self.service, tokenizer, [tokenizer.eos_token_id])

    def run(self, n: int = 1, budget: int = 300):
        return self.generator.generate(self.prompts, SamplingParams(n=n, max_new_tokens=budget))

    def score(self, groups, reward: dict | None = None):
        spec = RewardSpec.model_validate({"function": reward or {"type": "preset", "name": "exact_match"}})
        function = EpisodeReward(build_reward(spec))

        async def go():
            try:
                return await function.score(reward_samples(self.examples, groups, step=1))
            finally:
                await function.aclose()

        return asyncio.run(go())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.service.close()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("sandboxed", [False, True])
def test_an_episode_calls_the_tool_reads_the_result_and_answers(tokenizer, sandboxed):
    if sandboxed:
        require_bwrap()
    tools = {"functions": {"calculator": {"type": "python", "function": f"{CALCULATOR}:calculator"}}}
    tools["functions"]["calculator"]["sandboxed"] = sandboxed
    tools["schedule"] = "lockstep"  # the batches asserted below (test_scheduler.py: the independent schedule's)
    examples = [question(347, 29, "a"), question(512, 11, "b")]
    sandbox = SandboxSpec(isolation="strict") if sandboxed else None
    with Episodes(tokenizer, calculator_user, tools, examples, sandbox) as episodes:
        groups = episodes.run(n=2)
        outcomes = episodes.score(groups)
    eos = tokenizer.eos_token_id
    assert episodes.policy.calls == [2, 4]  # one first turn for the n=2 group of each prompt; then all 4 at once
    completion = groups[0][1]
    assert completion.text == "10063" and completion.finish_reason == "stop"
    first = [*ids(tokenizer, call("347*29")), eos]
    answer = [*ids(tokenizer, "10063"), eos]
    tool_part = completion.token_ids[len(first) : -len(answer)]
    assert completion.token_ids[: len(first)] == first and completion.token_ids[-len(answer) :] == answer
    assert tokenizer.decode(tool_part) == (
        "\n<|im_start|>user\n<tool_response>10063</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # only the model's own tokens are trained on, and only they carry log-probs
    assert completion.loss_mask == [1] * len(first) + [0] * len(tool_part) + [1] * len(answer)
    assert completion.logprobs == [TURN_LOGP if m else 0.0 for m in completion.loss_mask]
    # the episode's tokens are exactly the chat template's rendering of the whole conversation
    example = examples[0]
    turns = [{**m, "tool_calls": [template_arguments(c) for c in m["tool_calls"]]} if "tool_calls" in m else m
             for m in completion.turns]  # fmt: skip
    rendered = chat_text(tokenizer, [*example.messages, *turns], example.tools, None, add_generation_prompt=False)
    assert tokenizer.decode(completion.prompt_ids + completion.token_ids) + "\n" == rendered
    assert [m["role"] for m in completion.turns] == ["assistant", "tool", "assistant"]
    assert completion.turns[0]["tool_calls"][0] == {
        "id": "call01000",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "347*29"}'},
    }
    assert completion.turns[1] == {
        "role": "tool",
        "tool_call_id": "call01000",
        "name": "calculator",
        "content": "10063",
    }
    assert [o.score for o in outcomes] == [1.0, 1.0, 1.0, 1.0]
    # a Nova Lambda gets the whole conversation: prompt, the call, the tool's answer, the final answer
    lambda_messages = nova_entry(reward_samples(examples, groups, step=1)[0])["messages"]
    assert [m["role"] for m in lambda_messages] == ["user", "assistant", "tool", "assistant"]
    assert lambda_messages[1]["tool_calls"][0]["function"]["name"] == "calculator"
    assert lambda_messages[2]["content"] == "10063" and lambda_messages[3]["content"] == "10063"
    metrics = tool_metrics([c for g in groups for c in g])
    assert metrics["tools/turns/mean"] == 2.0 and metrics["tools/calculator/calls"] == 4.0
    assert metrics["tools/calculator/errors"] == 0.0 and metrics["tools/failed_episodes"] == 0.0
    masked = [len(c.loss_mask) - sum(c.loss_mask) for g in groups for c in g]
    assert masked[:2] == [len(tool_part)] * 2 and metrics["tools/masked_tokens/mean"] == sum(masked) / 4


def test_graders_see_every_call_of_the_episode(tokenizer):
    tools = IN_PROCESS
    with Episodes(tokenizer, calculator_user, tools, [question(347, 29)]) as episodes:
        groups = episodes.run()
        grader = {
            "type": "string_check",
            "name": "called",
            "input": "{{sample.output_tools[0].function.name}}:{{sample.output_text}}",
            "reference": "calculator:{{item.reference_answer}}",
            "operation": "eq",
        }
        (outcome,) = episodes.score(groups, {"type": "openai_grader", "grader": grader})
    assert outcome.score == 1.0


def test_max_turns_ends_an_episode_that_keeps_calling(tokenizer):
    tools = {
        "max_turns": 3,
        "functions": {"calculator": {"type": "python", "function": f"{CALCULATOR}:calculator", "sandboxed": False}},
    }
    with Episodes(tokenizer, lambda context: call("1+1"), tools, [question(2, 3)]) as episodes:
        ((completion,),) = episodes.run()
    assert completion.finish_reason == "max_turns"
    assert [m["role"] for m in completion.turns] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert episodes.policy.calls == [1, 1, 1]  # three model turns; the third turn's call is not run
    assert completion.metadata["tools"]["calls"] == {"calculator": 2}
    assert tool_metrics([completion])["tools/max_turns_ratio"] == 1.0


def test_the_token_budget_ends_an_episode(tokenizer):
    tools = IN_PROCESS
    first = len(ids(tokenizer, call("347*29"))) + 1
    with Episodes(tokenizer, calculator_user, tools, [question(347, 29)]) as episodes:
        ((completion,),) = episodes.run(budget=first + 5)  # the tool turn does not fit
    assert completion.finish_reason == "length" and len(completion.token_ids) == first + 5
    assert completion.loss_mask == [1] * first + [0] * 5
    # max_length bounds prompt + episode the same way
    prompt = len(episodes.prompts[0])
    with Episodes(tokenizer, calculator_user, tools, [question(347, 29)]) as episodes:
        params = SamplingParams(n=1, max_new_tokens=300, max_length=prompt + first + 5)
        ((capped,),) = episodes.generator.generate(episodes.prompts, params)
    assert capped.finish_reason == "length" and capped.token_ids == completion.token_ids


class ToolServer(BaseHTTPRequestHandler):
    """/add answers, /slow never in time, /broken with HTTP 500, /picky with a tool error."""

    seen: ClassVar[list[dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ToolServer.seen.append({"path": self.path, **body})
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/broken":
            self.send_response(500)
            self.end_headers()
            return
        answer = {"error": "expressions with + only"} if self.path == "/picky" else {"content": "7"}
        data = json.dumps(answer).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except BrokenPipeError:  # /slow: the client gave up waiting
            pass

    def log_message(self, *args):
        return None


class _ToolHttpServer(ThreadingHTTPServer):
    request_queue_size = 128  # the listen backlog: the default 5 overflows when 16 episodes connect at once


@pytest.fixture
def tool_server():
    server = _ToolHttpServer(("127.0.0.1", 0), ToolServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    ToolServer.seen = []
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def named_tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


def use(name: str) -> Example:
    return Example(
        id=name,
        messages=[{"role": "user", "content": f"Use {name}: What is 3+4?"}],
        fields={"reference_answer": "7"},
        tools=[named_tool(name)],
    )


def caller(context: str) -> str:
    import re

    results = re.findall(r"<tool_response>(.*?)</tool_response>", context)
    return results[-1] if results else call("3+4", re.findall(r"Use (\w+):", context)[-1])


def test_a_tool_endpoint_that_times_out_or_fails_ends_the_episode_counted_never_a_silent_zero(tokenizer, tool_server):
    remote = {"timeout_s": 0.2, "max_retries": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}
    tools = {
        "functions": {
            name: {"type": "http", "url": f"{tool_server}/{name}", "remote": remote}
            for name in ("add", "slow", "broken", "picky")
        }
    }
    examples = [use("add"), use("slow"), use("broken"), use("picky")]
    with Episodes(tokenizer, caller, tools, examples) as episodes:
        groups = episodes.run()
        outcomes = episodes.score(groups)
    add, slow, broken, picky = (g[0] for g in groups)
    assert add.finish_reason == "stop" and add.text == "7"
    assert slow.finish_reason == "tool_error" and slow.metadata["tool_failure"][0] == "timeout"
    assert broken.finish_reason == "tool_error" and broken.metadata["tool_failure"][0] == "server_error"
    # a tool that answers with an error: the model reads it and goes on
    assert picky.finish_reason == "stop" and picky.text == "error: expressions with + only"
    assert [o.score for o in outcomes] == [1.0, None, None, 0.0]
    assert [o.error_kind for o in outcomes] == [None, "timeout", "server_error", None]
    metrics = tool_metrics([add, slow, broken, picky])
    assert metrics["tools/failed_episodes"] == 2.0
    assert metrics["tools/slow/errors"] == metrics["tools/broken/errors"] == metrics["tools/picky/errors"] == 1.0
    assert metrics["tools/add/errors"] == 0.0 and metrics["tools/errors/total"] == 3.0
    assert metrics["tools/slow/latency_s/mean"] >= 0.4  # two attempts of 0.2 s
    sent = next(s for s in ToolServer.seen if s["path"] == "/add")
    assert sent["name"] == "add" and sent["arguments"] == {"expression": "3+4"}
    assert sent["call_id"] == "call01000" and sent["example_id"] == "add"
    assert sent["messages"][-1]["tool_calls"][0]["function"]["name"] == "add"
    assert (
        sum(s["path"] == "/slow" for s in ToolServer.seen) == 2
        and sum(s["path"] == "/broken" for s in ToolServer.seen) == 2
    )


def test_unknown_tools_and_broken_calls_go_back_to_the_model(tokenizer):
    tools = IN_PROCESS

    def policy(context: str) -> str:
        if "<tool_response>" not in context:
            return call("1+1", "search")
        if "<tool_response>" in context and context.count("<tool_response>") == 1:
            return call("2*(3")
        return "giving up"

    with Episodes(tokenizer, policy, tools, [question(2, 3)]) as episodes:
        ((completion,),) = episodes.run()
    assert completion.turns[1]["content"] == "error: no tool 'search' here; tools: calculator"
    assert completion.turns[3]["content"].startswith("error: ") and "SyntaxError" in completion.turns[3]["content"]
    assert completion.text == "giving up" and completion.finish_reason == "stop"
    assert completion.metadata["tools"]["errors"] == {"search": 1, "calculator": 1}
    assert "tool_failure" not in completion.metadata


ENVIRONMENT = """
class Counter:
    made = 0

    def __init__(self, config):
        self.scale = config["scale"]
        Counter.made += 1

    def reset(self, row):
        self.row_id, self.ticks = row["id"], 0

    def step(self, name, arguments):
        self.ticks += 1
        return {"tick": self.ticks, "row": self.row_id}

    def reward(self):
        return self.ticks * self.scale
"""


def test_an_environment_is_reset_per_rollout_steps_per_call_and_scores_the_episode(tokenizer, tmp_path):
    (tmp_path / "counter_env.py").write_text(ENVIRONMENT)
    tools = {
        "environment": {"module": str(tmp_path / "counter_env.py"), "class_name": "Counter", "config": {"scale": 0.5}}
    }

    def policy(context: str) -> str:
        return call("tick", "calculator") if context.count("<tool_response>") < 2 else "done"

    with Episodes(tokenizer, policy, tools, [question(2, 3, "r1")]) as episodes:
        groups = episodes.run(n=3)
        outcomes = episodes.score(groups)
    for completion in groups[0]:  # each rollout has its own environment: its ticks start at 1
        results = [json.loads(m["content"]) for m in completion.turns if m["role"] == "tool"]
        assert results == [{"tick": 1, "row": "r1"}, {"tick": 2, "row": "r1"}]
        assert completion.metadata["environment_reward"] == 1.0
    assert [o.score for o in outcomes] == [1.0, 1.0, 1.0]  # the environment's score, not exact_match's 0
    assert outcomes[0].sub_scores == {"environment": 1.0}
