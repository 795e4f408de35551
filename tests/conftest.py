"""Shared fixtures: the bundled demo model and data, and small recipes for fast runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

# tests/vllm need a real vLLM server (`make test-vllm` starts one and sets OPENRFT_VLLM_TESTS); without it
# they are not collected, so `pytest tests/vllm` alone reports that no test ran (exit 5), never a pass.
collect_ignore = [] if os.environ.get("OPENRFT_VLLM_TESTS") else ["vllm"]
DEMO_DATA = ROOT / "examples" / "arithmetic"

# a continuous reward, so that advantages (and so the updates) are not zero on a weak model
FUZZY_REWARD = {
    "function": {
        "type": "openai_grader",
        "grader": {
            "type": "text_similarity",
            "name": "fuzzy",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "evaluation_metric": "fuzzy_match",
        },
    }
}


def small_recipe(tmp_path: Path, **trainer) -> Path:
    """A Nova recipe for the demo model that runs a step in about a second on 2 CPU cores."""
    recipe = {
        "run": {
            "name": "test-run",
            "model_name_or_path": "openrft-demo",
            "data_s3_path": str(DEMO_DATA / "train.jsonl"),
            "validation_data_s3_path": str(DEMO_DATA / "validation.jsonl"),
        },
        "training_config": {
            "max_length": 64,
            "global_batch_size": 16,
            "rollout": {
                "advantage_strategy": {"number_generation": 4},
                "generator": {"max_new_tokens": 5, "temperature": 1.0, "top_k": 0},
                "rewards": {"preset_reward_function": "exact_match"},
            },
            "trainer": {
                "max_steps": 3,
                "save_steps": 1,
                "test_steps": 100,
                "kl_loss_coef": 0.01,
                "refit_freq": 2,
                "optim_config": {"lr": 2e-3},
                "peft": {"peft_scheme": "lora"},  # without a peft block a Nova recipe trains full rank
                **trainer,
            },
        },
        # one thread: the engine's default depends on the machine's load, and runs compared bit for bit
        # (straight against resumed) must compute alike
        "openrft": {"eval_max_examples": 16, "tensorboard": False, "lora_rank": 4, "threads": 1},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture
def recipe_factory(tmp_path):
    return lambda **trainer: small_recipe(tmp_path, **trainer)
