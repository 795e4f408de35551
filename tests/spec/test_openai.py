"""The OpenAI fine-tuning job with method.type = reinforcement: "auto" resolved, ranges, files, grader."""

from __future__ import annotations

from pathlib import Path

import pytest
from dialect_builders import OPENAI_GRADER, Sizes, openai_job

from openrft.spec.dialects import detect_dialect, resolve_document
from openrft.spec.errors import SpecError
from openrft.spec.rewards import OpenAIGraderReward

H = "method.reinforcement.hyperparameters"


def resolve(doc, train=100, validation=10, resolver=None):
    return resolve_document(doc, base_dir=Path("/jobs"), dataset_size=Sizes(train, validation), file_resolver=resolver)


def problems(doc, **kwargs) -> list[str]:
    with pytest.raises(SpecError) as info:
        resolve(doc, **kwargs)
    return [str(p) for p in info.value.problems]


def test_auto_everything():
    doc = openai_job(
        {
            k: "auto"
            for k in (
                "n_epochs",
                "batch_size",
                "learning_rate_multiplier",
                "eval_interval",
                "eval_samples",
                "compute_multiplier",
            )
        }
        | {"reasoning_effort": "default"}
    )
    assert detect_dialect(doc) == "openai"
    r = resolve(doc)
    s = r.spec
    assert s.dialect == "openai"
    # auto batch size 32; auto epochs: Vertex's rule min(110 * 32 / 100, 10) = 10 -> ceil(1000 / 32) = 32 steps
    assert (s.training.prompts_per_step, s.training.epochs, s.training.total_steps) == (32, 10, 32)
    assert (s.sampling.samples_per_prompt, s.evaluation.samples_per_prompt) == (16, 1)
    assert s.optimizer.lr == pytest.approx(2e-4)  # multiplier 1 x openrft-demo's base rate
    assert s.evaluation.interval == 4 and s.checkpoint.interval == 4  # once per epoch: ceil(100 / 32)
    assert s.sampling.reasoning_effort == "medium"
    assert (s.sampling.max_new_tokens, s.sampling.max_length) == (32768, 32768 + 8192)
    assert (s.lora.rank, s.lora.alpha, s.training.seed) == (16, 32.0, 0)
    assert s.reward.function == OpenAIGraderReward(grader=OPENAI_GRADER)
    assert r.provenance["training.prompts_per_step"].origin == "default"
    assert resolve(openai_job()).spec == s  # omitted = "auto"


@pytest.mark.parametrize(
    ("prompts", "hp", "per_step", "epochs", "steps"),
    [
        (100, {"n_epochs": 3, "batch_size": 10}, 10, 3, 30),
        (100, {"n_epochs": 1, "batch_size": 7}, 7, 1, 15),  # ceil(100 / 7)
        (5000, {}, 32, 0.704, 110),
        (5000, {"n_epochs": 50, "batch_size": 256}, 256, 50, 977),  # no 500-step cap: OpenAI documents none
        (40, {"batch_size": 1}, 1, 2.75, 110),  # auto epochs 110 * 1 / 40
    ],
)
def test_steps(prompts, hp, per_step, epochs, steps):
    s = resolve(openai_job(hp), train=prompts).spec
    assert (s.training.prompts_per_step, s.training.total_steps) == (per_step, steps)
    assert s.training.epochs == pytest.approx(epochs)


@pytest.mark.parametrize(("multiplier", "samples"), [(1, 16), (0.5, 8), (0.00001, 2), (0.1, 2), (0.2, 3), (10, 160)])
def test_compute_multiplier_scales_samples_per_prompt(multiplier, samples):
    assert resolve(openai_job({"compute_multiplier": multiplier})).spec.sampling.samples_per_prompt == samples


@pytest.mark.parametrize(
    ("effort", "canonical"), [("default", "medium"), ("low", "low"), ("medium", "medium"), ("high", "high")]
)
def test_reasoning_effort(effort, canonical):
    assert resolve(openai_job({"reasoning_effort": effort})).spec.sampling.reasoning_effort == canonical


@pytest.mark.parametrize(
    ("hp", "error"),
    [
        ({"batch_size": 0}, f"{H}.batch_size: 0 is outside [1, 256]"),
        ({"batch_size": 257}, f"{H}.batch_size: 257 is outside [1, 256]"),
        ({"batch_size": 2.5}, f"{H}.batch_size: 2.5 must be an integer or 'auto'"),
        ({"n_epochs": 0}, f"{H}.n_epochs: 0 is outside [1, 50]"),
        ({"n_epochs": 51}, f"{H}.n_epochs: 51 is outside [1, 50]"),
        ({"n_epochs": "two"}, f"{H}.n_epochs: 'two' must be an integer or 'auto'"),
        ({"learning_rate_multiplier": 0}, f"{H}.learning_rate_multiplier: 0 must be > 0"),
        ({"compute_multiplier": 0.000009}, f"{H}.compute_multiplier: 9e-06 is outside [1e-05, 10]"),
        ({"compute_multiplier": 10.5}, f"{H}.compute_multiplier: 10.5 is outside [1e-05, 10]"),
        ({"learning_rate_multiplier": 1e30}, f"{H}.learning_rate_multiplier: 1e+30 is outside [0, 10]"),
        ({"eval_interval": 0}, f"{H}.eval_interval: 0 is outside [1, 100000]"),
        ({"eval_samples": 0}, f"{H}.eval_samples: 0 is outside [1, 512]"),
        ({"eval_samples": True}, f"{H}.eval_samples: True must be an integer or 'auto'"),
        ({"reasoning_effort": "minimal"}, f"{H}.reasoning_effort: 'minimal' is not one of 'default', 'low'"),
    ],
)
def test_ranges(hp, error):
    found = problems(openai_job(hp))
    assert len(found) == 1 and found[0].startswith(error), found


@pytest.mark.parametrize(
    "hp",
    [
        {"batch_size": 1},
        {"batch_size": 256},
        {"n_epochs": 1},
        {"n_epochs": 50},
        {"learning_rate_multiplier": 0.001},
        {"compute_multiplier": 0.00001},
        {"compute_multiplier": 10},
        {"eval_interval": 1},
        {"eval_samples": 1},
    ],
)
def test_values_just_inside_the_ranges_resolve(hp):
    assert resolve(openai_job(hp)).spec.training.total_steps >= 1


def test_explicit_values_and_job_fields():
    doc = openai_job(
        {"n_epochs": 2, "batch_size": 20, "learning_rate_multiplier": 0.5, "eval_interval": 3, "eval_samples": 4},
        seed=42,
        suffix="demo",
        metadata={"team": "x"},
    )
    s = resolve(doc).spec
    assert (s.training.total_steps, s.optimizer.lr, s.evaluation.interval, s.checkpoint.interval) == (10, 1e-4, 3, 3)
    assert (s.evaluation.samples_per_prompt, s.training.seed, s.name, s.metadata) == (4, 42, "demo", {"team": "x"})


def test_method_and_job_fields_are_checked_together():
    doc = openai_job({"batch_size": 0}, suffix="x" * 65, metadata={f"k{i}": "v" for i in range(17)})
    doc["method"]["type"] = "supervised"
    found = problems(doc)
    assert [f.split(":")[0] for f in found] == ["suffix", "metadata", f"{H}.batch_size", "method.type"]
    assert "has 17 keys; at most 16 are allowed" in found[1]
    assert "'supervised' is not reinforcement fine-tuning" in found[3]


def test_file_ids_go_through_the_resolver():
    store = {"file-train": "/store/train.jsonl", "file-val": "/store/val.jsonl"}
    doc = openai_job(training_file="file-train", validation_file="file-val")
    s = resolve(doc, resolver=store.__getitem__).spec
    assert (s.data.train, s.data.validation) == ("/store/train.jsonl", "/store/val.jsonl")
    doc["validation_file"] = "file-missing"
    assert problems(doc, resolver=store.__getitem__) == [
        "validation_file: 'file-missing' cannot be resolved: 'file-missing'"
    ]


def test_without_a_resolver_file_ids_are_refused_and_paths_accepted():
    found = problems(openai_job(training_file="file-abc123"))
    assert found[0].startswith("training_file: 'file-abc123' is an OpenAI file id, which only the OpenRFT service")
    s = resolve(openai_job(training_file="file:///data/train.jsonl")).spec
    assert s.data.train == "/data/train.jsonl"


def test_integrations_are_ignored_with_a_warning():
    r = resolve(openai_job(integrations=[{"type": "wandb", "wandb": {"project": "p"}}]))
    assert [str(w).split(":")[0] for w in r.warnings] == ["integrations"]


def test_extensions_the_job_covers_are_refused():
    doc = openai_job()
    doc["openrft"] = {"seed": 3, "eval_samples_per_prompt": 2, "lora_rank": 8, "max_new_tokens": 64}
    found = problems(doc)
    assert [f.split(":")[0] for f in found] == ["openrft.seed", "openrft.eval_samples_per_prompt"]
    del doc["openrft"]["seed"], doc["openrft"]["eval_samples_per_prompt"]
    s = resolve(doc).spec
    assert (s.lora.rank, s.lora.alpha, s.sampling.max_new_tokens, s.sampling.max_length) == (8, 16.0, 64, 64 + 8192)


def test_grader_errors_are_reported_at_the_users_paths_with_the_other_problems():
    doc = openai_job({"n_epochs": 0})
    doc["method"]["reinforcement"]["grader"] = {
        "type": "multi",
        "name": "m",
        "calculate_output": "a + python",
        "graders": {
            "a": {**OPENAI_GRADER, "operation": "equals"},
            "python": {"type": "python", "name": "p", "source": ""},
            "judge": {
                "type": "score_model",
                "name": "j",
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "ok"}, {"type": "input_text"}]}],
            },
        },
    }
    g = "method.reinforcement.grader.graders"
    assert problems(doc) == [
        f"{H}.n_epochs: 0 is outside [1, 50]",
        f"{g}.a.operation: 'equals' is not one of 'eq', 'ne', 'like', 'ilike'",
        f"{g}.python.source: '' string should have at least 1 character",
        f"{g}.judge.input[0].content[1].text: is required",
    ]


def sdk_job_body() -> dict:
    """A job body with every field of the official SDK's JobCreateParams and reinforcement method."""
    from openai.types.fine_tuning import job_create_params, reinforcement_hyperparameters_param

    hp_fields = reinforcement_hyperparameters_param.ReinforcementHyperparametersParam.__annotations__
    hp = {"reasoning_effort": "medium", **{name: "auto" for name in hp_fields if name != "reasoning_effort"}}
    doc = openai_job(
        hp,
        seed=7,
        suffix="my-run",
        metadata={"team": "x"},
        integrations=[{"type": "wandb", "wandb": {"project": "p", "entity": None, "name": None, "tags": ["t"]}}],
        hyperparameters={"n_epochs": 2, "batch_size": "auto", "learning_rate_multiplier": "auto"},
    )
    doc["method"]["reinforcement"]["response_format"] = None
    assert set(doc) >= set(job_create_params.JobCreateParams.__annotations__) - {"validation_file"}
    return doc


def test_every_field_the_official_sdk_sends_is_accepted():
    r = resolve(sdk_job_body())
    s = r.spec
    assert (s.training.seed, s.name, s.metadata, s.training.epochs) == (7, "my-run", {"team": "x"}, 2.0)
    warned = sorted(w.path for w in r.warnings)
    assert warned == ["hyperparameters", "integrations"]  # deprecated top-level hyperparameters; wandb


def test_method_hyperparameters_win_over_the_deprecated_top_level_ones():
    r = resolve(openai_job({"n_epochs": 3}, hyperparameters={"n_epochs": 5, "batch_size": 10}), train=100)
    assert (r.spec.training.epochs, r.spec.training.prompts_per_step) == (3.0, 10)
    assert "used for batch_size" in str(next(w for w in r.warnings if w.path == "hyperparameters"))


def test_response_format_is_accepted_with_a_warning():
    doc = openai_job()
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    doc["method"]["reinforcement"]["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }
    r = resolve(doc)
    assert [w.path for w in r.warnings] == ["method.reinforcement.response_format"]
    assert "sample.output_json" in str(r.warnings[0])


@pytest.mark.parametrize("method", ["supervised", "dpo"])
def test_other_methods_are_refused_as_not_rft(method):
    doc = openai_job()
    doc["method"] = {"type": method, method: {"hyperparameters": {"n_epochs": 1}}}
    found = problems(doc)
    assert len(found) == 1 and found[0].startswith(f"method.type: '{method}' is not reinforcement fine-tuning")


def test_other_method_blocks_beside_reinforcement_are_ignored_with_a_warning():
    doc = openai_job()
    doc["method"]["supervised"] = {"hyperparameters": {}}
    assert [w.path for w in resolve(doc).warnings] == ["method.supervised"]


def test_graders_without_a_name_are_named_after_their_type_or_key():
    doc = openai_job()
    doc["method"]["reinforcement"]["grader"] = {
        "type": "multi",
        "calculate_output": "0.7 * exact + 0.3 * fuzzy",
        "graders": {
            "exact": {"type": "string_check", "input": "{{sample.output_text}}", "reference": "x", "operation": "eq"},
            "fuzzy": {
                "type": "text_similarity",
                "input": "{{sample.output_text}}",
                "reference": "x",
                "evaluation_metric": "fuzzy_match",
            },
        },
    }
    grader = resolve(doc).spec.reward.function.grader
    assert grader.name == "multi" and {k: g.name for k, g in grader.graders.items()} == {
        "exact": "exact",
        "fuzzy": "fuzzy",
    }


def test_a_multi_grader_may_hold_one_grader_object_as_the_sdk_types_it():
    doc = openai_job()
    doc["method"]["reinforcement"]["grader"] = {
        "type": "multi",
        "name": "m",
        "calculate_output": "2 * exact",
        "graders": {"type": "string_check", "name": "exact", "input": "a", "reference": "a", "operation": "eq"},
    }
    assert list(resolve(doc).spec.reward.function.grader.graders) == ["exact"]


def test_every_reasoning_effort_of_the_sdk_is_accepted_in_grader_sampling_params():
    from typing import get_args

    from openai.types.shared.reasoning_effort import ReasoningEffort

    for effort in get_args(get_args(ReasoningEffort)[0]):
        doc = openai_job()
        doc["method"]["reinforcement"]["grader"] = {
            "type": "score_model",
            "model": "gpt-4.1",
            "input": [{"role": "user", "content": "{{sample.output_text}}"}],
            "sampling_params": {"reasoning_effort": effort, "seed": 42, "temperature": 0},
        }
        assert resolve(doc).spec.reward.function.grader.sampling_params.reasoning_effort == effort


def test_azure_openai_training_type_is_accepted_with_a_warning():
    r = resolve(openai_job(trainingType="GlobalStandard"))
    assert [w.path for w in r.warnings] == ["trainingType"]
