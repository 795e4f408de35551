"""The sync probe on Tinker samplers (service/tinker/engine.py): when a snapshot's weights are loaded into the
sampling adapter, the sampler's log-probs of the probe must be the training model's at the snapshot. A correct
load passes with its metric in the training model's step row; a load that leaves the old weights (planted: the
load does nothing) fails the sample naming the sampler, after one reload."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tinker")
from tinker import types

from openrft.engine.sync_check import SyncProbeError
from openrft.rollout.sync_probe import TOLERANCES
from openrft.service.tinker.engine import Engine, LoraSettings
from openrft.service.tinker.futures import Queued


def _engine():
    engine = Engine()
    model = engine.create_model("m", "local", "openrft-demo", LoraSettings(rank=4, seed=0))
    return engine, model


def _move(model, seed: int) -> None:
    """A training step's worth of change to the adapter (its B matrices, zero at the start)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.base.peft.named_parameters():
            if "lora_B" in name and ".m." in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)


def _sample(engine, sampler, model) -> None:
    prompt = model.base.tokenizer.encode("What is 12+30? ")
    answers = []
    params = types.SamplingParams(max_tokens=3, temperature=1.0)
    engine.sample(sampler, 2, params, False, [Queued(prompt, answers.append)], lambda: [])
    assert len(answers) == 1


def test_a_correct_load_passes_with_its_metric():
    engine, model = _engine()
    for i in range(2):
        _move(model, i)
        _sample(engine, engine.snapshot_sampler(f"s{i}", model), model)
        assert 0 <= model.pending["sync/max_logprob_diff"] <= TOLERANCES[("transformers", "float32")]
        model.pending.pop("sync/max_logprob_diff")


def test_a_load_that_keeps_the_old_weights_is_caught():
    engine, model = _engine()
    _move(model, 0)
    _sample(engine, engine.snapshot_sampler("s0", model), model)
    base = model.base
    real_load = base.load_state
    base.load_state = lambda name, state: None if name.startswith("sampler_") else real_load(name, state)
    _move(model, 1)
    sampler = engine.snapshot_sampler("s1", model)
    with pytest.raises(SyncProbeError, match=r"Tinker sampler s1 \(a snapshot of training model m\) .* by (\S+) on"):
        _sample(engine, sampler, model)
    assert model.pending["sync/max_logprob_diff"] > TOLERANCES[("transformers", "float32")]
    base.load_state = real_load  # fixed: the next request loads the snapshot again, and passes
    _sample(engine, sampler, model)
