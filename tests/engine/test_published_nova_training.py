"""Nova recipes in the published shapes (tests/spec/published) train 2 steps on the demo model, with their
cloud-only names mapped on the command line and a published-style Lambda file as the reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from openrft.cli import main
from openrft.models import resolve_model_path

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "tests" / "spec" / "published"
TRAIN = ROOT / "examples" / "arithmetic" / "train.jsonl"
REWARD = """
def lambda_handler(event, context):
    return [
        {"id": s["id"], "aggregate_reward_score": float(s["messages"][-1]["content"].strip() == s["reference_answer"])}
        for s in event
    ]
"""


def run(tmp_path: Path, name: str, *options: str) -> Path:
    from tests.rewards.helpers import require_bwrap

    require_bwrap()
    recipe = tmp_path / name
    data = tmp_path / "train.jsonl"  # 120 lines: 50 held out for validation keep the evaluations short
    data.write_text("".join(TRAIN.read_text().splitlines(keepends=True)[:120]))
    recipe.write_text((PUBLISHED / name).read_text().replace("DATA_PATH", str(data)))
    (tmp_path / "reward.py").write_text(REWARD)
    out = tmp_path / "run"
    handler = f"{tmp_path / 'reward.py'}:lambda_handler"
    argv = ["train", str(recipe), "--output", str(out), "--steps", "2", "--quiet", "--map-lambda", handler, *options]
    assert main(argv) == 0
    return out


def steps(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "critic/rewards/mean" in r]


@pytest.mark.slow
def test_hyperpod_lora_recipe_trains_two_steps(tmp_path):
    out = run(tmp_path, "hyperpod_lora.yaml", "--map-model", "nova-lite-2/prod=openrft-demo")
    assert len(steps(out)) == 2
    assert (out / "adapter" / "adapter_config.json").exists()


@pytest.mark.slow
def test_full_rank_recipe_trains_every_weight(tmp_path):
    out = run(tmp_path, "smtj_full_rank.yaml", "--map-model", "nova-lite-2/prod=openrft-demo")
    assert len(steps(out)) == 2
    assert not (out / "adapter" / "adapter_config.json").exists()
    base = load_file(Path(resolve_model_path("openrft-demo")) / "model.safetensors")
    trained = load_file(out / "adapter" / "model.safetensors")
    assert set(trained) == set(base)
    changed = [name for name in base if not (trained[name].float() == base[name].float()).all()]
    assert len(changed) > len(base) // 2, changed  # not an adapter: the weights themselves moved
