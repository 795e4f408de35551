"""A 2-step demo job with each loss a job may name (``openrft.loss_fn``): it trains, its metrics are finite,
and the learner computed the named loss (every policy-loss call goes through the registry's entry)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

import openrft.algo.loss as loss_module
from openrft.algo import losses
from openrft.engine import RFTJob
from openrft.spec.dialects import load_job


@pytest.mark.parametrize("name", losses.names(jobs=True))
def test_a_two_step_job_trains_with_each_loss(name, recipe_factory, tmp_path, monkeypatch):
    path = recipe_factory(max_steps=2)
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"] |= {"loss_fn": name, "ppo_mini_batches": 2}  # the second update's ratio is not 1
    path.write_text(yaml.safe_dump(recipe))
    spec = load_job(path)
    assert spec.algorithm.loss_fn == name

    called: list[str] = []
    per_token, surrogate = loss_module.per_token, loss_module.clipped_surrogate
    monkeypatch.setattr(loss_module, "per_token", lambda n, *a: called.append(n) or per_token(n, *a))
    monkeypatch.setattr(loss_module, "clipped_surrogate", lambda *a: called.append("grpo") or surrogate(*a))

    run_dir = tmp_path / "run"
    summary = RFTJob(spec, run_dir, show_progress=False).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "actor/pg_loss" in r]
    assert len(trained) == 2 and all(r["actor/updates"] == 2 for r in trained)
    for row in trained:
        assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/grad_norm"])
    assert any(r["actor/grad_norm"] > 0 for r in trained)
    assert called and set(called) == {name}
