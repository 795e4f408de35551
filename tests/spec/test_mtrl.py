"""Nova's multi-turn RFT recipe ("MTRL", recipe_version 1.0.25): OpenRFT's fixture in the published shape
(tests/spec/mtrl_recipe.yaml) parsed and explained field by field, the recipe as published (its sections
only, plus the launcher's job inputs) validated, and each bound and each value OpenRFT cannot honour
refused by name."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from dialect_builders import Sizes

from openrft.spec.dialects import detect_dialect, resolve_document
from openrft.spec.dialects.mtrl import is_mtrl_recipe
from openrft.spec.errors import SpecError

FIXTURE = Path(__file__).with_name("mtrl_recipe.yaml")


def fixture() -> dict:
    return yaml.safe_load(FIXTURE.read_text())


def resolve(doc, train=200, validation=40):
    return resolve_document(doc, base_dir=Path("/jobs"), dataset_size=Sizes(train, validation))


def problems(doc) -> list[str]:
    with pytest.raises(SpecError) as info:
        resolve(doc)
    return [str(p) for p in info.value.problems]


# canonical path -> (the recipe's field, value in the spec)
EXPLAINED = {
    "name": ("run.name", "mtrl-fixture"),
    "data.train": ("run.data_s3_path", "s3://bucket/mtrl/train.jsonl"),
    "data.validation": ("run.validation_data_s3_path", "s3://bucket/mtrl/validation.jsonl"),
    "output_dir": ("run.output_s3_path", "s3://bucket/mtrl/output"),
    "training.prompts_per_step": ("batch.training_batch_size", 16),
    "sampling.samples_per_prompt": ("batch.group_size", 8),
    "evaluation.max_examples": ("batch.val_batch_size", 40),
    "evaluation.samples_per_prompt": ("batch.val_group_size", 4),
    "algorithm.scale_advantages_by_std": ("rl.advantage_normalization", False),
    "algorithm.loss_fn": ("rl.loss_fn", "cispo"),
    "algorithm.loss_fn_config": ("rl.clip_low_threshold", {"clip_low_threshold": 0.5, "clip_high_threshold": 3.0}),
    "sampling.temperature": ("sampling_params.temperature", 0.9),
    "sampling.top_p": ("sampling_params.top_p", 0.9),
    "sampling.max_new_tokens": ("sampling_params.max_tokens", 2048),
    "evaluation.temperature": ("val_sampling_params.temperature", 0.2),
    "evaluation.pass_k": ("val_metrics_config.pass_k_values", [1, 2, 4, 8]),
    "evaluation.success_threshold": ("val_metrics_config.success_threshold", 0.5),
    "training.epochs": ("schedule.epochs", 2.0),
    "training.total_steps": ("schedule.max_steps", 25),  # min(ceil(2 × 200 / 16), 40)
    "checkpoint.interval": ("schedule.save_every", 10),
    "evaluation.interval": ("schedule.val_every", 20),
    "evaluation.at_start": ("schedule.val_at_start", False),
    "model.name_or_path": ("model.model_name", "openrft-demo"),  # mapped by openrft.model_map
    "sampling.max_length": ("model.max_sequence_length", 16384),
    "lora.rank": ("model.lora_rank", 16),
    "lora.alpha": ("model.lora_alpha", 32.0),
    "optimizer.lr": ("model.learning_rate", 2e-5),
    "optimizer.adam_beta1": ("model.adam_beta1", 0.85),
    "optimizer.adam_beta2": ("model.adam_beta2", 0.98),
    "optimizer.adam_eps": ("model.adam_eps", 1e-10),
    "optimizer.weight_decay": ("model.weight_decay", 0.05),
    "optimizer.max_grad_norm": ("model.grad_clip_norm", 2.0),
    "lora.lora_plus_lr_ratio": ("model.lora_plus_lr_ratio", 16.0),
    "reward.remote.max_concurrency": ("rollout.max_concurrency", 48),
    "reward.remote.timeout_s": ("rollout.timeout", 900.0),
    "reward.remote.max_retries": ("rollout.max_retries", 5),
    "rollout.strategy": ("async_config.max_steps_off_policy", "off_policy_async"),
    "rollout.age_tolerance": ("async_config.max_steps_off_policy", 2),
    "algorithm.data_filter": ("data_filter", {"max_filter_rate": 0.25, "max_repeated_tokens": 20, "max_ngram_size": 8}),
}


def value_at(spec, path):
    node = spec
    for part in path.split("."):
        node = getattr(node, part)
    return node.model_dump() if hasattr(node, "model_dump") else node


def test_the_fixture_is_an_mtrl_recipe_and_every_field_is_explained():
    doc = fixture()
    assert detect_dialect(doc) == "nova" and is_mtrl_recipe(doc)
    r = resolve(doc)
    for path, (field, value) in EXPLAINED.items():
        assert value_at(r.spec, path) == value, path
        assert r.provenance[path].field == field, path
    assert r.provenance["training.total_steps"].origin == "derived"
    assert r.spec.reward.function.type == "nova_lambda"
    assert r.spec.metadata == {"model_type": "mtrl", "display_name": "OpenRFT MTRL fixture", "recipe_version": "1.0.25"}
    warned = {w.path: w.message for w in r.warnings}
    assert "rollout.rollout_tps" in warned  # accepted, not used: said so
    assert "8" in warned["val_metrics_config.pass_k_values"]  # pass@8 needs 8 samples of a prompt; 4 are drawn


def test_the_recipe_as_published_validates_with_the_launchers_inputs():
    """The published sections with their published values (1.0.25), only the job's inputs added in run."""
    doc = {
        "display_name": "Agentic RFT",
        "recipe_version": "1.0.25",
        "run": {"name": "mtrl-nova-lite-2-0-lora", "model_type": "mtrl", "data_s3_path": "s3://b/train.jsonl",
                "reward_lambda_arn": "arn:aws:lambda:us-east-1:1:function:r"},
        "batch": {"training_batch_size": 32, "group_size": 4, "val_batch_size": None, "val_group_size": 1,
                  "val_random_sample": False},
        "rl": {"advantage_method": "group_based", "advantage_normalization": True, "gamma": 1.0, "loss_fn": "ppo",
               "clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
        "sampling_params": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 4096},
        "val_sampling_params": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 4096},
        "val_metrics_config": {"pass_k_values": [1, 2, 4, 8, 16, 32], "success_threshold": 1.0},
        "schedule": {"epochs": 1, "max_steps": 100, "save_every": 5, "val_every": 10, "val_at_start": True},
        "model": {"model_name": "nova-textgeneration-lite-v2", "max_sequence_length": 32768, "lora_rank": 32,
                  "lora_alpha": 64, "learning_rate": 1e-5, "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-8,
                  "weight_decay": 0.01, "grad_clip_norm": 1.0, "lora_plus_lr_ratio": 32.0},
        "rollout": {"max_concurrency": 96, "timeout": 600.0, "max_retries": 3, "rollout_tps": 5},
        "async_config": {"max_steps_off_policy": 3},
        "data_filter": {"max_filter_rate": 0.5, "max_repeated_tokens": 30, "max_ngram_size": 30},
        "openrft": {"model_map": {"nova-textgeneration-lite-v2": "openrft-demo"},
                    "lambda_map": {"*": "http://127.0.0.1:9/reward"}},
    }  # fmt: skip
    r = resolve(doc, train=1000)
    assert r.spec.algorithm.loss_fn == "ppo"
    assert r.spec.algorithm.loss_fn_config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert r.spec.training.total_steps == 24  # ceil(1 × 750 / 32) (250 held out for validation), under 100
    assert r.spec.rollout.strategy == "off_policy_async" and r.spec.rollout.age_tolerance == 3


def test_left_out_fields_take_the_launchers_template_defaults():
    doc = {"run": {"model_type": "mtrl", "data_s3_path": "/d/train.jsonl"}, "model": {"model_name": "openrft-demo"},
           "openrft": {"lambda_map": {"*": "http://127.0.0.1:9/reward"}}}  # fmt: skip
    r = resolve(doc)
    spec = r.spec
    assert (spec.training.prompts_per_step, spec.sampling.samples_per_prompt) == (32, 4)
    assert (spec.sampling.temperature, spec.sampling.top_p, spec.sampling.max_new_tokens) == (0.7, 0.95, 4096)
    assert (spec.lora.rank, spec.lora.alpha, spec.optimizer.adam_eps, spec.optimizer.max_grad_norm) == (
        32,
        64,
        1e-12,
        0,
    )
    # min(ceil(150 / 32), 50): 50 of the 200 examples held out for validation
    assert spec.algorithm.loss_fn == "ppo" and spec.training.total_steps == 5
    assert spec.algorithm.data_filter is None  # no data_filter section: no filtering
    assert r.provenance["sampling.temperature"].origin == "default"


REFUSED = [
    ({"batch": {"training_batch_size": 12}}, r"batch.training_batch_size: .*12"),
    ({"batch": {"group_size": 1}}, r"batch.group_size: 1 is outside \[2, 32\]"),
    ({"batch": {"val_random_sample": True}}, r"batch.val_random_sample: True is not supported"),
    ({"rl": {"advantage_method": "monte_carlo"}}, r"rl.advantage_method: 'monte_carlo' is not supported by OpenRFT"),
    ({"rl": {"advantage_method": "dapo"}}, r"rl.advantage_method: .*dapo"),
    ({"rl": {"gamma": 0.9}}, r"rl.gamma: 0.9 is not supported below 1"),
    ({"rl": {"loss_fn": "dro"}}, r"rl.loss_fn: .*dro"),
    ({"rl": {"clip_low_threshold": 1.5}}, r"rl.clip_low_threshold: 1.5 is outside \[0, 1\]"),
    ({"rl": {"clip_high_threshold": 11}}, r"rl.clip_high_threshold: 11 is outside \[1, 10\]"),
    ({"sampling_params": {"max_tokens": 100}}, r"sampling_params.max_tokens: 100 is outside \[512, 8192\]"),
    ({"sampling_params": {"top_p": 0}}, r"sampling_params.top_p: 0 must be above 0"),
    ({"val_sampling_params": {"top_p": 0.5}}, r"val_sampling_params.top_p: 0.5 differs from sampling_params.top_p"),
    ({"val_sampling_params": {"max_tokens": 1024}}, r"val_sampling_params.max_tokens: 1024 differs"),
    ({"schedule": {"max_steps": 0}}, r"schedule.max_steps: 0 is outside \[1, 1000\]"),
    ({"model": {"lora_rank": 8}}, r"model.lora_rank: 8 is outside \[16, 64\]"),
    ({"model": {"learning_rate": 0.1}}, r"model.learning_rate: .*0.1"),
    ({"rollout": {"max_concurrency": 200}}, r"rollout.max_concurrency: 200 is outside \[32, 96\]"),
    ({"async_config": {"max_steps_off_policy": 11}}, r"async_config.max_steps_off_policy: 11 is outside \[0, 10\]"),
    ({"data_filter": {"max_filter_rate": 2}}, r"data_filter.max_filter_rate: 2 is outside \[0, 1\]"),
    ({"openrft": {"loss_fn": "gspo"}}, r"openrft.loss_fn: .*is set by rl.loss_fn"),
    ({"run": {"model_type": "rft"}}, r"run.model_type: .*mtrl"),
    ({"unknown_section": {}}, r"unknown_section"),
]


@pytest.mark.parametrize(("change", "message"), REFUSED)
def test_each_bound_and_unsupported_value_is_refused_by_name(change, message):
    doc = fixture()
    for section, values in change.items():
        doc[section] = {**doc.get(section, {}), **values} if isinstance(doc.get(section), dict) else values
    found = problems(doc)
    assert any(re.search(message, p) for p in found), found


def test_the_inputs_the_recipe_leaves_to_its_launcher_are_required_by_name():
    doc = copy.deepcopy(fixture())
    for name in ("data_s3_path", "reward_lambda_arn"):
        del doc["run"][name]
    del doc["openrft"]["lambda_map"]
    del doc["model"]["model_name"]
    found = " | ".join(problems(doc))
    for field in (
        "run.data_s3_path: is required",
        "run.reward_lambda_arn: is required",
        "model.model_name: is required",
    ):
        assert field in found, found
