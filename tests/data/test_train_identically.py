"""The same examples in the Vertex format and in the messages format train identically: same Examples,
same prompt token ids, same held-out split, and (a short engine run) the same adapter weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from openrft.data.loader import load_dataset
from openrft.data.vertex_format import to_vertex_record
from openrft.engine.setup import load_datasets
from openrft.models import REGISTERED_MODELS, load_tokenizer
from openrft.rewards.kinds.preset import reference_text
from openrft.rollout.prompts import render_prompt
from openrft.spec.job import JobSpec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
pytestmark = pytest.mark.skipif(
    not (REGISTERED_MODELS["openrft-demo"] / "config.json").exists() or not (EXAMPLES / "train.jsonl").exists(),
    reason="the demo model and data are built by scripts/build_demo_model.py",
)


def write_both(tmp_path: Path, name: str, rows: list[dict]) -> tuple[str, str]:
    messages, vertex = tmp_path / f"{name}.jsonl", tmp_path / f"{name}_vertex.jsonl"
    messages.write_text("".join(json.dumps(r) + "\n" for r in rows))
    vertex.write_text("".join(json.dumps(to_vertex_record(r)) + "\n" for r in rows))
    return str(messages), str(vertex)


@pytest.fixture
def files(tmp_path):
    train = [json.loads(line) for line in (EXAMPLES / "train.jsonl").read_text().splitlines()[:80]]
    validation = [json.loads(line) for line in (EXAMPLES / "validation.jsonl").read_text().splitlines()[:4]]
    system = {"role": "system", "content": "Answer with the number only."}
    train[1]["messages"] = [system, *train[1]["messages"]]  # one example with a system instruction
    return write_both(tmp_path, "train", train), write_both(tmp_path, "validation", validation)


def spec(train: str, validation: str | None, eval_max: int | None = 2) -> JobSpec:
    """A tiny job; the entropy bonus moves the adapter even when every reward of a group is equal."""
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "openrft-demo", "dtype": "float32"},
            "data": {"train": train, "validation": validation},
            "sampling": {"samples_per_prompt": 4, "max_new_tokens": 4, "max_length": 96},
            "training": {"prompts_per_step": 2, "total_steps": 2, "seed": 3},
            "optimizer": {"lr": 1e-2},
            "lora": {"rank": 4, "alpha": 8},
            "algorithm": {"ent_coeff": 0.01},
            "evaluation": {"interval": 0, "at_start": False, "max_examples": eval_max},
            "reward": {"function": {"type": "preset", "name": "exact_match"}},
            "tracking": {"tensorboard": False},
            "runtime": {"device": "cpu", "threads": 1},
        }
    )


def test_same_examples_and_prompt_tokens(files):
    (train, train_vertex), _ = files
    plain, vertex = load_dataset(train, True), load_dataset(train_vertex, True)
    assert len(plain) == len(vertex) == 80
    tokenizer = load_tokenizer("openrft-demo")
    for a, b in zip(plain, vertex):
        assert (a.id, a.messages, a.tools, a.line) == (b.id, b.messages, b.tools, b.line)
        assert reference_text(a.reference_answer) == reference_text(b.reference_answer) == a.fields["reference_answer"]
        assert b.fields["references"] == {"ground_truth_answer": a.fields["reference_answer"]}
        assert render_prompt(tokenizer, a.messages, a.tools, "high") == render_prompt(
            tokenizer, b.messages, b.tools, "high"
        )
    assert plain[1].messages[0] == {"role": "system", "content": "Answer with the number only."}


def test_same_default_validation_split(files):
    (train, train_vertex), _ = files
    a, b = load_datasets(spec(train, None, None), True), load_datasets(spec(train_vertex, None, None), True)
    assert len(a.validation) == 40 and len(a.train) == 40  # 50 wanted, at most half of 80
    assert [e.id for e in a.train] == [e.id for e in b.train]
    assert [e.id for e in a.validation] == [e.id for e in b.validation]


@pytest.mark.slow
def test_same_adapter_after_two_engine_steps(files, tmp_path):
    from openrft.engine import RFTJob

    (train, train_vertex), (validation, validation_vertex) = files
    results = []
    for name, (t, v) in {"messages": (train, validation), "vertex": (train_vertex, validation_vertex)}.items():
        run_dir = tmp_path / f"run-{name}"
        summary = RFTJob(spec(t, v), run_dir, show_progress=False).run()
        assert summary["status"] == "succeeded" and summary["steps"] == 2
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        results.append((load_file(run_dir / "adapter" / "adapter_model.safetensors"), metrics))
    (weights_a, metrics_a), (weights_b, metrics_b) = results
    assert weights_a.keys() == weights_b.keys() and weights_a
    for key in weights_a:
        assert torch.equal(weights_a[key], weights_b[key]), key
    assert any(not torch.equal(w, torch.zeros_like(w)) for k, w in weights_a.items() if "lora_B" in k)  # it trained
    rewards = [[m.get("critic/rewards/mean") for m in ms] for ms in (metrics_a, metrics_b)]
    assert rewards[0] == rewards[1]
