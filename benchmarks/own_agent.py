"""Bring your own agent: trajectories per second through the agent routes against the built-in tool loop, and
the routes' added latency per turn.

Throughput: examples/calculator's model (not fine-tuned: it calls its calculator in about a quarter of its
episodes) answers ``rows`` of the example's validation rows, ``n`` each, at temperature 1 with the recipe's
budget (112 new tokens within 192), three turns at most. Side by side, in alternating order each round:

- ``builtin``: the built-in tool loop (``ToolGenerator``; the calculator an in-process Python tool; the job's
  default ``independent`` schedule, whose continuous decode batch keeps each episode's KV cache);
- ``builtin_lockstep``: the same loop in lock-step (turn k of every episode in one ``generate``);
- ``agent``: examples/own_agent's agent (``serve.py``: the official ``openai`` client, in its own process)
  driven through the agent routes (``AgentGenerator``; its turns sampled in batches of whole ``generate``
  calls, each later turn prefilled from its whole context).

Each system first runs 4 rows untimed (first calls: lazy imports, the agent process's first requests).

Latency: one trajectory at a time, a generator that answers at once (no model time), three turns per
trajectory (two calls and an answer), the official client's ``chat.completions.create`` timed around each
call in the agent: what the routes add to a turn (HTTP both ways, the client, the chat template, the record).
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from benchmarks.common import load_average
from openrft.data.records import Example
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.prompts import render_prompt
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams
from openrft.spec.agents import AgentSpec
from openrft.spec.rewards import SandboxSpec
from openrft.spec.tools import ToolsSpec
from openrft.tools.agent_runtime import AgentGenerator, AgentService
from openrft.tools.agent_trajectory import Renderer
from openrft.tools.episodes import ToolGenerator, ToolService, row_prompts

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CALCULATOR = EXAMPLES / "calculator"
PARAMS = SamplingParams(n=4, temperature=1.0, max_new_tokens=112, max_length=192)
LATENCY_PARAMS = SamplingParams(n=4, max_new_tokens=400)  # room for two calls, their results and the answer
LATENCIES: list[float] = []  # seconds per timed call, filled by ``timed_agent``


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(count: int) -> list[Example]:
    lines = (CALCULATOR / "validation.jsonl").read_text().splitlines()[:count]
    return [
        Example(
            id=r["id"], messages=r["messages"], fields={"reference_answer": r["reference_answer"]}, tools=r["tools"]
        )
        for r in map(json.loads, lines)
    ]


def _reward(groups: list[list[Completion]], examples: list[Example]) -> float:
    scores = [c.text.strip() == e.fields["reference_answer"] for e, g in zip(examples, groups) for c in g]
    return round(sum(scores) / len(scores), 3)


WIDE = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 8}
"""The calculator model's architecture widened (about 19M parameters, random weights): a model that spends more
per trajectory, the same tokenizer, template, rows and agent (it writes no calls: one turn, to the budget)."""


def _model(wide: bool):
    if not wide:
        return AutoModelForCausalLM.from_pretrained(CALCULATOR / "model", dtype=torch.float32).eval()
    config = AutoConfig.from_pretrained(CALCULATOR / "model")
    for name, value in WIDE.items():
        setattr(config, name, value)
    config.layer_types = ["full_attention"] * WIDE["num_hidden_layers"]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def throughput(rows: int, rounds: int, log=print, wide: bool = False) -> dict:
    before = load_average()
    tokenizer = AutoTokenizer.from_pretrained(CALCULATOR / "model")
    model = _model(wide)
    eos = [tokenizer.eos_token_id]
    examples = _rows(rows)
    prompts = row_prompts(examples, [render_prompt(tokenizer, e.messages, e.tools) for e in examples])
    function = f"{CALCULATOR / 'calculator.py'}:calculator"
    tools = {"max_turns": 3, "functions": {"calculator": {"type": "python", "function": function, "sandboxed": False}}}
    port = _free_port()
    agent = subprocess.Popen(
        [sys.executable, "serve.py", "--port", str(port)], cwd=EXAMPLES / "own_agent", stdout=subprocess.PIPE
    )
    agent.stdout.readline()  # it listens
    spec = AgentSpec(url=f"http://127.0.0.1:{port}/", max_concurrency=1024, max_retries=0)
    service = AgentService(spec, "bench", Renderer(tokenizer, frozenset(eos)))
    services = {
        name: ToolService(ToolsSpec.model_validate({**tools, "schedule": schedule}), SandboxSpec(isolation="weak"))
        for name, schedule in (("builtin", "independent"), ("builtin_lockstep", "lockstep"))
    }

    def generator(seed: int) -> TransformersGenerator:
        return TransformersGenerator(model, tokenizer, eos, tokenizer.pad_token_id, seed=seed)

    makers = {
        "builtin": lambda g: ToolGenerator(g, services["builtin"], tokenizer, eos),
        "builtin_lockstep": lambda g: ToolGenerator(g, services["builtin_lockstep"], tokenizer, eos),
        "agent": lambda g: AgentGenerator(g, service),
    }
    runs: dict[str, list[dict]] = {name: [] for name in makers}
    try:
        for make in makers.values():  # first calls (imports, the agent process's first requests) not timed
            make(generator(0)).generate(prompts[:4], PARAMS)
        for r in range(rounds):
            order = list(makers) if r % 2 == 0 else list(reversed(makers))
            for name in order:
                episodes = makers[name](generator(r))
                started = time.perf_counter()
                groups = episodes.generate(prompts, PARAMS)
                seconds = time.perf_counter() - started
                count = sum(len(g) for g in groups)
                failed = sum("tool_failure" in c.metadata for g in groups for c in g)
                run = {
                    "seconds": round(seconds, 2),
                    "trajectories": count,
                    "trajectories_per_s": round(count / seconds, 2),
                    "reward": _reward(groups, examples),
                    "failed": failed,
                    "turns_mean": round(sum(c.metadata["tools"]["turns"] for g in groups for c in g) / count, 3),
                }
                runs[name].append(run)
                log(f"  round {r + 1} {name}: {run}")
    finally:
        service.close()
        for tool_service in services.values():
            tool_service.close()
        agent.terminate()
        agent.wait(timeout=10)
    pooled = {
        name: round(sum(x["trajectories"] for x in rs) / sum(x["seconds"] for x in rs), 2) for name, rs in runs.items()
    }
    return {
        "model": "calculator widened (random weights)" if wide else "calculator",
        "parameters": sum(p.numel() for p in model.parameters()),
        "rows": rows,
        "samples_per_row": PARAMS.n,
        "rounds": rounds,
        "runs": runs,
        "trajectories_per_s": pooled,
        "ratio_vs_builtin": round(pooled["agent"] / pooled["builtin"], 2),
        "ratio_vs_builtin_lockstep": round(pooled["agent"] / pooled["builtin_lockstep"], 2),
        "threads": torch.get_num_threads(),
        "load": {"before": before, "after": load_average()},
    }


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


class InstantGenerator(PolicyVersioned):
    """Answers every turn at once: a calculator call on turns that follow no result, else the result."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.rng = None

    def generate(self, prompts, params, seed=None):
        groups = []
        for prompt in prompts:
            context = self.tokenizer.decode(prompt)
            results = context.count("<tool_response>")
            text = (
                "42"
                if results >= 2
                else '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
            )
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
            groups.append([Completion(list(prompt), ids, [-0.1] * len(ids), text, "stop", 0)])
        return groups

    def load_adapter(self, weights, version):
        return None


def timed_agent(request: dict) -> str:
    """examples/own_agent's loop with each ``create`` call timed (the benchmark's operator callable)."""
    sys.path.insert(0, str(EXAMPLES / "own_agent"))
    from agent import TOOLS, calculator
    from openai import OpenAI

    client = OpenAI(base_url=request["base_url"], api_key=request["api_key"], max_retries=0)
    messages = list(request["row"]["messages"])
    for _ in range(3):
        started = time.perf_counter()
        response = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        LATENCIES.append(time.perf_counter() - started)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            result = calculator(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


def latency(trajectories: int) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(CALCULATOR / "model")
    eos = [tokenizer.eos_token_id]
    spec = AgentSpec(callable="benchmarks.own_agent:timed_agent", max_concurrency=1, max_retries=0)
    service = AgentService(spec, "bench", Renderer(tokenizer, frozenset(eos)))
    examples = _rows(1)
    prompts = row_prompts(examples, [render_prompt(tokenizer, e.messages, e.tools) for e in examples])
    agent = AgentGenerator(InstantGenerator(tokenizer), service)
    LATENCIES.clear()
    try:
        agent.generate(prompts, LATENCY_PARAMS)  # warm up
        LATENCIES.clear()
        for _ in range(trajectories // 4):
            groups = agent.generate(prompts, LATENCY_PARAMS)
            assert all(c.text == "42" and "tool_failure" not in c.metadata for c in groups[0])
    finally:
        service.close()
    ms = sorted(x * 1000 for x in LATENCIES)
    return {
        "turns": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "load": load_average(),
    }
