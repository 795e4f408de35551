"""Tool episodes with uneven tool latency: the independent schedule against lock-step, side by side.

Two workloads, each an example's model answering the example's validation rows, ``n`` episodes each, at
temperature 1 with the recipe's budget, its tool answering after 0-2 s (``benchmarks/tool_latency.py``):

- ``guessing``: examples/guessing's model plays the number game (``NumberGame``, a stateful environment):
  every episode calls its tool 1 to 4 times, one guess a turn, so every episode waits on its tool;
- ``calculator``: examples/calculator's model (not fine-tuned: it calls its tool in about a quarter of its
  episodes) answers arithmetic questions; most episodes never wait on a tool, so generation dominates.

The generator holds ``in_flight`` episodes at a time in both schedules:

- lock-step (before the independent schedule, and ``tools.schedule: lockstep``): ``generate`` on
  ``in_flight / n`` prompts at a time, each turn of the batch waiting for its slowest call;
- independent: one ``generate`` on every prompt with ``tools.max_episodes_in_flight: in_flight``: an episode
  moves on when its own calls are back, and a new prompt starts as soon as episodes end. The local
  generator runs it as one continuous decode batch (``openrft.rollout.continuous``): each turn joins the
  batch at the next decode step and leaves it when it ends, a later turn continuing its episode's KV cache;
- independent_batches (for comparison): the same schedule with whole ``generate`` batches (each batch decodes
  until its longest turn ends, each later turn prefilled from the whole context), as before the continuous batch.

Reward, to show the schedules sample the task equally well: the share of games won (the environment's
``reward()``), or of answers equal to the reference (``exact_match``). Each run also counts the model's
forward passes and the token positions they computed, and for the continuous batch its decode steps,
prefilled tokens and kept-KV hits. With ``rounds`` the three run again, in the opposite order each round (a
load that changes weighs on each alike), and the figures are pooled over the rounds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.common import load_average
from openrft.data.records import Example
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.prompts import render_prompt
from openrft.rollout.types import Completion, SamplingParams
from openrft.spec.rewards import SandboxSpec
from openrft.spec.tools import ToolsSpec
from openrft.tools.episodes import ToolGenerator, ToolService, row_prompts

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@dataclass(frozen=True)
class Workload:
    """An example's model, rows and tool, as the tools benchmark runs them."""

    name: str
    tools: dict  # the job's ``tools`` block, without its schedule
    max_new_tokens: int
    max_length: int
    reward: Callable[[Example, Completion], float]

    @property
    def folder(self) -> Path:
        return EXAMPLES / self.name

    def examples(self, count: int) -> list[Example]:
        rows = [json.loads(line) for line in (self.folder / "validation.jsonl").read_text().splitlines()][:count]
        return [
            Example(r["id"], r["messages"], {"reference_answer": r["reference_answer"]}, tools=r["tools"]) for r in rows
        ]


def _answer_matches(example: Example, completion: Completion) -> float:
    return float(completion.text.strip() == example.fields["reference_answer"])


def _game_won(example: Example, completion: Completion) -> float:
    return float(completion.metadata.get("environment_reward") or 0.0)


WORKLOADS = {
    "guessing": Workload(
        "guessing",
        {"max_turns": 5, "environment": {"module": "benchmarks.tool_latency", "class_name": "SlowNumberGame"}},
        max_new_tokens=192,
        max_length=256,
        reward=_game_won,
    ),
    "calculator": Workload(
        "calculator",
        {
            "max_turns": 3,
            "functions": {
                "calculator": {"type": "python", "function": "benchmarks.tool_latency:calculator", "sandboxed": False}
            },
        },
        max_new_tokens=112,
        max_length=192,
        reward=_answer_matches,
    ),
}


class _WholeBatches:
    """The generator without its continuous decode batch: the scheduler then calls ``generate`` per batch."""

    continuous = False

    def __init__(self, inner: TransformersGenerator):
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class _Passes:
    """Counts the model's forward passes and the token positions they compute (padding included)."""

    def __init__(self, model):
        self.passes = self.positions = 0
        self.handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.passes += 1
        self.positions += int(ids.numel()) if ids is not None else 0

    def close(self) -> dict:
        self.handle.remove()
        return {"forward_passes": self.passes, "positions_computed": self.positions}


def _session_counters(inner: TransformersGenerator) -> dict:
    """Wraps ``inner.decoding`` so that the continuous batch's counters are read when it ends."""
    seen: dict = {}
    decoding = inner.decoding

    @contextmanager
    def recorded(params, seed=None):
        with decoding(params, seed) as session:
            try:
                yield session
            finally:
                store = session.store
                seen.update(
                    decode_steps=session.steps,
                    prefilled_tokens=session.prefilled_tokens,
                    kv_hits=store.hits,
                    kv_misses=store.misses,
                    kv_stale=store.stale,
                    kv_reused_tokens=store.reused_tokens,
                )

    inner.decoding = recorded
    return seen


def _run(
    workload: Workload, schedule: str, model, tokenizer, examples, n: int, in_flight: int, seed: int, batches: bool
) -> dict:
    tools = {**workload.tools, "schedule": schedule}
    if schedule == "independent":
        tools["max_episodes_in_flight"] = in_flight
    service = ToolService(ToolsSpec.model_validate(tools), SandboxSpec(isolation="weak"))
    eos = [tokenizer.eos_token_id]
    inner = TransformersGenerator(model, tokenizer, eos, tokenizer.pad_token_id, seed=seed)
    counters = _session_counters(inner)
    episodes = ToolGenerator(_WholeBatches(inner) if batches else inner, service, tokenizer, eos)
    prompts = row_prompts(examples, [render_prompt(tokenizer, e.messages, e.tools) for e in examples])
    params = SamplingParams(
        n=n, temperature=1.0, max_new_tokens=workload.max_new_tokens, max_length=workload.max_length
    )
    chunk = len(prompts) if schedule == "independent" else max(1, in_flight // n)
    passes = _Passes(model)
    started = time.perf_counter()
    try:
        groups = [g for i in range(0, len(prompts), chunk) for g in episodes.generate(prompts[i : i + chunk], params)]
    finally:
        service.close()
        computed = passes.close()
    seconds = time.perf_counter() - started
    completions = [(e, c) for e, group in zip(examples, groups) for c in group]
    score = sum(workload.reward(e, c) for e, c in completions)
    calls = sum(sum(c.metadata["tools"]["calls"].values()) for _, c in completions)
    return {
        "seconds": round(seconds, 2),
        "episodes": len(completions),
        "episodes_per_s": round(len(completions) / seconds, 3),
        "reward": round(score / len(completions), 4),
        "calls": calls,
        **computed,
        **counters,
    }


SCHEDULES = {
    "lockstep": ("lockstep", False),
    "independent": ("independent", False),
    "independent_batches": ("independent", True),
}


COUNTERS = (
    "calls",
    "forward_passes",
    "positions_computed",
    "decode_steps",
    "prefilled_tokens",
    "kv_hits",
    "kv_misses",
    "kv_stale",
    "kv_reused_tokens",
)


def _pooled(runs: list[dict]) -> dict:
    """The runs of one schedule together: episodes per second over every round, rewards over every episode."""
    episodes, seconds = sum(r["episodes"] for r in runs), sum(r["seconds"] for r in runs)
    reward = sum(r["reward"] * r["episodes"] for r in runs) / episodes
    counted = [k for k in COUNTERS if all(k in r for r in runs)]
    return {
        "seconds": round(seconds, 2),
        "episodes": episodes,
        "episodes_per_s": round(episodes / seconds, 3),
        "reward": round(reward, 4),
        **{k: sum(r[k] for r in runs) for k in counted},
        "rounds": runs,
    }


def tool_throughput(
    workload: str = "guessing",
    prompts: int = 64,
    n: int = 4,
    in_flight: int = 32,
    seed: int = 0,
    rounds: int = 1,
    log=print,
) -> dict:
    """``rounds`` rounds of the three schedules on ``workload``, the order turned round each round (a machine
    whose load changes weighs on each alike); episodes per second pooled over the rounds."""
    work = WORKLOADS[workload]
    tokenizer = AutoTokenizer.from_pretrained(work.folder / "model")
    model = AutoModelForCausalLM.from_pretrained(work.folder / "model", dtype=torch.float32)
    examples = work.examples(prompts)
    load = {"before": load_average()}
    runs: dict[str, list[dict]] = {name: [] for name in SCHEDULES}
    for round_index in range(rounds):
        order = list(SCHEDULES) if round_index % 2 == 0 else list(SCHEDULES)[::-1]
        for name in order:
            schedule, batches = SCHEDULES[name]
            result = _run(work, schedule, model, tokenizer, examples, n, in_flight, seed + round_index, batches)
            result["load_after"] = load_average()
            log(f"  {workload} round {round_index + 1} {name}: {json.dumps(result)}")
            runs[name].append(result)
    load["after"] = load_average()
    pooled = {name: _pooled(results) for name, results in runs.items()}
    independent, lockstep, batches = pooled["independent"], pooled["lockstep"], pooled["independent_batches"]
    return {
        "workload": workload,
        "episodes_per_s": independent["episodes_per_s"],
        "lockstep_episodes_per_s": lockstep["episodes_per_s"],
        "speedup": round(independent["episodes_per_s"] / lockstep["episodes_per_s"], 2),
        "reward": independent["reward"],
        "lockstep_reward": lockstep["reward"],
        "batches_episodes_per_s": batches["episodes_per_s"],
        **pooled,
        "prompts": prompts,
        "n": n,
        "in_flight": in_flight,
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "load": load,
        "tool_latency_s": [0.0, 2.0],
    }
