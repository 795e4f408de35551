"""Bring your own agent: the official ``openai`` client drives trajectories through the agent routes, and the
job records the tokens the model sampled (a scripted policy or the calculator example's real model, the real
chat template, real HTTP on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import httpx
import pytest
import torch
from openai import OpenAI

from openrft.engine.rollouts import reward_samples
from openrft.rewards import build_reward
from openrft.rewards.episodes import EpisodeReward
from openrft.spec.rewards import RewardSpec
from tests.tools.agent_harness import AgentRun
from tests.tools.scripted import CALCULATOR_TOOL, ROOT, ScriptedGenerator, call, question, tool_tokenizer

CALCULATOR_MODEL = ROOT / "examples" / "calculator" / "model"


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


def client_of(request: dict) -> OpenAI:
    return OpenAI(base_url=request["base_url"], api_key=request["api_key"], max_retries=0)


def calculator_agent(turns: int = 3, stream_last: bool = False):
    """A plain agent loop: ask, run the calculator calls, until an answer (the shape of examples/own_agent)."""

    def agent(request: dict) -> str:
        client = client_of(request)
        messages = list(request["row"]["messages"])
        for _ in range(turns):
            response = client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content
            for tool_call in message.tool_calls:
                expression = json.loads(tool_call.function.arguments)["expression"]
                messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": str(eval(expression))})
            if stream_last:  # the answer turn streamed
                chunks = client.chat.completions.create(
                    model="m", messages=messages, tools=[CALCULATOR_TOOL], stream=True
                )
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return ""

    return agent


def answer_after(results_needed: int):
    """A scripted policy: calls the calculator until it has ``results_needed`` results, then answers the last."""

    def policy(context: str) -> str:
        results = re.findall(r"<tool_response>(.*?)</tool_response>", context)
        if len(results) >= results_needed:
            return results[-1]
        return call(re.findall(r"What is (\S+)\?", context)[-1])

    return policy


def test_the_openai_client_gets_tool_calls_and_a_streamed_answer_and_the_record_holds_the_sampled_tokens(tokenizer):
    seen: list = []

    def agent(request: dict) -> str:
        client = client_of(request)
        messages = list(request["row"]["messages"])
        first = client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
        seen.append(first)
        message = first.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for tool_call in message.tool_calls:
            expression = json.loads(tool_call.function.arguments)["expression"]
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": str(eval(expression))})
        stream = client.chat.completions.create(
            model="m", messages=messages, tools=[CALCULATOR_TOOL], stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        seen.append(chunks)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    policy = ScriptedGenerator(tokenizer, answer_after(1))
    with AgentRun(tokenizer, policy, agent, [tokenizer.eos_token_id]) as run:
        (group,) = run.run([question(347, 29)])
        sampled = run.generator.sampled
    first, chunks = seen
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (tool_call,) = choice.message.tool_calls
    assert tool_call.type == "function" and tool_call.function.name == "calculator"
    assert json.loads(tool_call.function.arguments) == {"expression": "347*29"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == str(347 * 29)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"

    (completion,) = group
    assert completion.text == str(347 * 29) and "tool_failure" not in completion.metadata
    # turn 2's context is the record so far: prompt, turn 1's sampled tokens, the template's continuation
    (context_1, turn_1), (context_2, turn_2) = sampled
    assert context_1 == completion.prompt_ids
    assert context_2[: len(context_1) + len(turn_1.token_ids)] == context_1 + turn_1.token_ids
    assert completion.prompt_ids + completion.token_ids == context_2 + turn_2.token_ids
    trained = [t for t, m in zip(completion.token_ids, completion.loss_mask) if m]
    assert trained == turn_1.token_ids + turn_2.token_ids
    masked = completion.token_ids[len(turn_1.token_ids) : -len(turn_2.token_ids)]
    assert "<tool_response>10063</tool_response>" in tokenizer.decode(masked)
    assert completion.metadata["tools"]["calls"] == {"calculator": 1}


def test_a_three_turn_agent_with_its_tool(tokenizer):
    policy = ScriptedGenerator(tokenizer, answer_after(2))
    with AgentRun(tokenizer, policy, calculator_agent(turns=3), [tokenizer.eos_token_id]) as run:
        (group,) = run.run([question(12, 34)], n=2)
    for completion in group:
        assert completion.text == "408" and completion.finish_reason == "stop"
        assert completion.metadata["tools"]["turns"] == 3
        assert completion.metadata["tools"]["calls"] == {"calculator": 2}
        runs = re.findall(r"1+", "".join(map(str, completion.loss_mask)))
        assert len(runs) == 3  # the model's three turns, tool results and template tokens between them
        assert [m["role"] for m in completion.turns] == ["assistant", "tool", "assistant", "tool", "assistant"]
        assert all(lp == 0.0 for lp, m in zip(completion.logprobs, completion.loss_mask) if not m)


def test_the_real_models_sampled_token_ids_and_logprobs_are_recorded_as_sampled(tokenizer):
    from openrft.models import eos_token_ids, load_causal_lm, load_tokenizer
    from openrft.rollout.local import TransformersGenerator

    real = load_tokenizer(str(CALCULATOR_MODEL))
    model = load_causal_lm(str(CALCULATOR_MODEL), torch.device("cpu"), torch.float32).eval()
    eos = eos_token_ids(real, model)
    generator = TransformersGenerator(model, real, eos, real.pad_token_id, seed=3)

    def agent(request: dict) -> str:  # answers every call with a number, up to three turns
        client = client_of(request)
        messages = list(request["row"]["messages"])
        for _ in range(3):
            message = client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
            message = message.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "4131"} for c in message.tool_calls]
        return ""

    with AgentRun(real, generator, agent, eos) as run:
        groups = run.run([question(100 + i, 17, f"q{i}") for i in range(4)], n=8, budget=112)
        sampled = run.generator.sampled
    completions = [c for g in groups for c in g]
    assert all("tool_failure" not in c.metadata for c in completions)
    assert any(c.metadata["tools"]["turns"] > 1 for c in completions)  # some went on after a call
    for completion in completions:  # each run of trained tokens is one sampled turn, exactly as sampled
        full, base = completion.prompt_ids + completion.token_ids, len(completion.prompt_ids)
        runs = [(m.start(), m.end()) for m in re.finditer(r"1+", "".join(map(str, completion.loss_mask)))]
        assert len(runs) == completion.metadata["tools"]["turns"]
        for begin, end in runs:
            context, own = full[: base + begin], completion.token_ids[begin:end]
            cut = end == len(completion.token_ids) and completion.finish_reason == "length"
            # a turn cut at the trajectory's budget keeps the start of what was sampled; any other, all of it
            turns = [
                c for ctx, c in sampled if ctx == context and (c.token_ids[: len(own)] if cut else c.token_ids) == own
            ]
            # a group's trajectories can sample the same turn in different batches, whose padding moves the
            # log-probs in their last digits: the record holds exactly those of one of them
            assert any(completion.logprobs[begin:end] == turn.logprobs[: len(own)] for turn in turns), (begin, turns)


def test_64_concurrent_trajectories_sample_their_turns_in_shared_batches(tokenizer):
    policy = ScriptedGenerator(tokenizer, answer_after(1))
    examples = [question(100 + i, 11, f"q{i}") for i in range(16)]
    with AgentRun(tokenizer, policy, calculator_agent(), [tokenizer.eos_token_id], batch_window_s=2.0) as run:
        groups = run.run(examples, n=4)
        batches = run.agent.service.counts, policy.calls
    assert [c.text for g in groups for c in g] == [str((100 + i) * 11) for i in range(16) for _ in range(4)]
    counts, calls = batches
    assert counts["completed"] == 64 and counts["dropped"] == 0
    # every trajectory's turn 1 in one generate, equal contexts as one prompt with n 4 (one prefill); turn 2
    # likewise (the scripted policy wrote the same call in a prompt's 4 trajectories)
    assert calls == [16, 16]


def test_a_changed_history_is_answered_and_the_trajectory_dropped_and_counted(tokenizer):
    def agent(request: dict) -> str:
        client = client_of(request)
        messages = list(request["row"]["messages"])
        message = client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL])
        message = message.choices[0].message
        messages.append({"role": "assistant", "content": "let me think"})  # not what the model wrote
        messages.append({"role": "user", "content": "go on"})
        return client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR_TOOL]).id

    policy = ScriptedGenerator(tokenizer, answer_after(1))
    with AgentRun(tokenizer, policy, agent, [tokenizer.eos_token_id]) as run:
        (group,) = run.run([question(2, 3)])
        counts = dict(run.service.counts)
    (completion,) = group
    kind, message = completion.metadata["tool_failure"]
    assert kind == "history_changed" and "do not start with the 2 recorded ones" in message
    assert counts == {"started": 1, "completed": 0, "dropped": 1, "retried": 0}  # not retried: it would again
    outcome = score(group, question(2, 3))
    assert not outcome.ok and outcome.error_kind == "history_changed"


def score(group, example):
    reward = EpisodeReward(
        build_reward(RewardSpec.model_validate({"function": {"type": "preset", "name": "exact_match"}}))
    )

    async def go():
        try:
            return await reward.score(reward_samples([example], [group], step=1))
        finally:
            await reward.aclose()

    return asyncio.run(go())[0]


def test_an_agent_that_dies_mid_trajectory_is_retried_then_dropped_and_counted_never_scored(tokenizer):
    attempts: list[str] = []

    def agent(request: dict) -> str:
        attempts.append(request["trajectory_id"])
        client_of(request).chat.completions.create(model="m", messages=request["row"]["messages"])
        raise RuntimeError("the agent died")  # after its first turn: the entrypoint answers 500

    policy = ScriptedGenerator(tokenizer, answer_after(1))
    with AgentRun(tokenizer, policy, agent, [tokenizer.eos_token_id], max_retries=1) as run:
        (group,) = run.run([question(2, 3)])
        counts = dict(run.service.counts)
    (completion,) = group
    assert len(set(attempts)) == 2  # a new trajectory id for the retry
    kind, message = completion.metadata["tool_failure"]
    assert kind == "agent_error" and "HTTP 500" in message and "the agent died" in message
    assert counts == {"started": 2, "completed": 0, "dropped": 1, "retried": 1}
    outcome = score(group, question(2, 3))
    assert not outcome.ok and outcome.score is None  # dropped, never a 0


def test_a_reward_sent_after_complete_rollout_is_the_trajectorys_reward(tokenizer):
    rewarded = threading.Event()

    def agent(request: dict) -> str:
        base, key = request["base_url"], request["api_key"]
        client_of(request).chat.completions.create(model="m", messages=request["row"]["messages"])
        headers = {"Authorization": f"Bearer {key}"}
        early = httpx.post(f"{base}/update-reward", json={"Rewards": [1.0]}, headers=headers)
        assert early.status_code == 409 and "CompleteRollout" in early.json()["error"]["message"]
        job_url = base.rsplit("/", 1)[0]
        done = httpx.post(
            f"{job_url}/complete-rollout", json={"TrajectoryId": request["trajectory_id"]}, headers=headers
        )
        assert done.status_code == 200 and done.json() == {}

        def later():  # after the entrypoint answered: await_reward keeps the trajectory open for it
            reward = {"TrajectoryId": request["trajectory_id"], "Rewards": [0.25, 0.5], "ClientToken": "t1"}
            if httpx.post(f"{job_url}/update-reward", json=reward, headers=headers).status_code == 200:
                rewarded.set()

        threading.Timer(0.3, later).start()
        return "done"

    policy = ScriptedGenerator(tokenizer, answer_after(1))
    with AgentRun(tokenizer, policy, agent, [tokenizer.eos_token_id], await_reward=True, timeout=30) as run:
        (group,) = run.run([question(2, 3)])
    assert rewarded.wait(5)
    (completion,) = group
    assert completion.metadata["agent_reward"] == 0.75
    outcome = score(group, question(2, 3))
    assert outcome.ok and outcome.score == 0.75 and outcome.sub_scores == {"agent": 0.75}


def test_the_routes_refuse_another_token_and_another_jobs_trajectory(tokenizer):
    refused: dict[str, int] = {}

    def agent(request: dict) -> str:
        base, trajectory = request["base_url"], request["trajectory_id"]
        body = {"model": "m", "messages": request["row"]["messages"]}
        wrong = {"Authorization": "Bearer another-jobs-token"}
        refused["token"] = httpx.post(f"{base}/chat/completions", json=body, headers=wrong).status_code
        right = {"Authorization": f"Bearer {request['api_key']}"}
        other_job = base.replace("/job-a/", "/job-b/")
        refused["job"] = httpx.post(f"{other_job}/chat/completions", json=body, headers=right).status_code
        unknown = base.replace(trajectory, "traj-0")
        refused["trajectory"] = httpx.post(f"{unknown}/chat/completions", json=body, headers=right).status_code
        bad = httpx.post(f"{base}/chat/completions", json={**body, "n": 2}, headers=right)
        refused["n"] = bad.status_code
        assert bad.json()["error"]["param"] == "n"
        return client_of(request).chat.completions.create(**body).choices[0].message.content

    policy = ScriptedGenerator(tokenizer, answer_after(1))
    with AgentRun(tokenizer, policy, agent, [tokenizer.eos_token_id]) as run:
        (group,) = run.run([question(2, 3)])
    assert refused == {"token": 401, "job": 404, "trajectory": 404, "n": 400}
    assert "tool_failure" not in group[0].metadata


def test_serve_model_answers_the_models_calls_as_openai_tool_calls_so_the_agent_runs_unchanged_in_use():
    from openrft.rollout.server import _assistant_message
    from openrft.rollout.types import Completion

    text = call("347*29")
    message, finish = _assistant_message(Completion([1], [2], [0.0], text, "stop", 0), [CALCULATOR_TOOL])
    assert finish == "tool_calls" and message["content"] is None
    (tool_call,) = message["tool_calls"]
    assert tool_call["type"] == "function" and tool_call["function"]["name"] == "calculator"
    assert json.loads(tool_call["function"]["arguments"]) == {"expression": "347*29"}
    plain, finish = _assistant_message(Completion([1], [2], [0.0], text, "stop", 0), None)  # no tools offered
    assert finish == "stop" and plain == {"role": "assistant", "content": text}
