"""The Vertex reinforcementTuningSpec request: every default, range bound and derived value."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from dialect_builders import Sizes, vertex_request

from openrft.spec.dialects import resolve_document
from openrft.spec.errors import SpecError
from openrft.spec.rewards import VertexReward

HP = "reinforcementTuningSpec.hyperParameters"
DEMO_RATE = 2e-4  # openrft-demo's base learning rate


def resolve(doc, train=100, validation=10, base_dir=Path("/jobs")):
    return resolve_document(doc, base_dir=base_dir, dataset_size=Sizes(train, validation))


def problems(doc, **kwargs) -> list[str]:
    with pytest.raises(SpecError) as info:
        resolve(doc, **kwargs)
    return [str(p) for p in info.value.problems]


def test_defaults_of_an_empty_hyperparameters_block():
    r = resolve(vertex_request())
    s = r.spec
    assert (s.dialect, s.model.name_or_path) == ("vertex", "openrft-demo")
    assert s.training.prompts_per_step == 32 and s.sampling.samples_per_prompt == 16
    # 100 prompts, batchSize 32: min(110 * 32 / 100, 10) = 10 epochs -> ceil(10 * 100 / 32) = 32 steps
    assert s.training.epochs == 10 and s.training.total_steps == 32 and r.total_steps == 32
    assert s.optimizer.lr == pytest.approx(DEMO_RATE) and s.model.base_learning_rate == DEMO_RATE
    assert (s.lora.rank, s.lora.alpha) == (16, 32.0)
    assert (s.sampling.max_new_tokens, s.sampling.max_length) == (32768, 32768 + 8192)
    assert s.sampling.reasoning_effort == "high"
    assert s.evaluation.interval == 4 and s.checkpoint.interval == 4  # once per epoch: ceil(100 / 32)
    assert (s.data.train, s.data.validation) == ("/jobs/train.jsonl", "/jobs/val.jsonl")
    assert (s.data.train_examples_limit, s.data.validation_examples_limit) == (5000, 500)
    assert s.reward.function == VertexReward(single=vertex_request()["reinforcementTuningSpec"]["singleRewardConfig"])
    assert r.warnings == [] and r.dataset_prompts == 100


@pytest.mark.parametrize(
    ("prompts", "batch", "hp", "epochs", "steps"),
    [
        (100, 32, {}, 10, 32),  # the example: 10 epochs, 32 steps
        (5000, 32, {}, 0.704, 110),  # 110 * 32 / 5000 = 0.704 epochs, exactly 110 steps (no float noise)
        (3520, 32, {}, 1, 110),  # 110 * 32 / 3520 = 1 epoch
        (352, 32, {}, 10, 110),  # 110 * 32 / 352 = 10: not capped
        (351, 32, {}, 10, 110),  # 10.03 -> capped at 10 epochs: ceil(3510 / 32) = 110
        (100, 32, {"epochCount": 0.5}, 0.5, 2),  # fractional epochs: ceil(50 / 32)
        (100, 32, {"epochCount": 3}, 3, 10),  # ceil(300 / 32)
        (100, 7, {"epochCount": 1, "samplesPerPrompt": 16}, 1, 15),  # ceil(100 / 7)
        (5000, 32, {"epochCount": 0.704}, 0.704, 110),
        (100, 32, {"stepCount": 7}, 7 * 32 / 100, 7),
        (100, 32, {"stepCount": 500}, 160, 500),
    ],
)
def test_total_steps(prompts, batch, hp, epochs, steps):
    r = resolve(vertex_request({"batchSize": batch, **hp}), train=prompts)
    assert r.spec.training.total_steps == steps
    assert r.spec.training.epochs == pytest.approx(epochs)
    assert r.warnings == []


@pytest.mark.parametrize(
    ("prompts", "hp", "uncapped"),
    [
        (5000, {"epochCount": 10}, 1563),  # ceil(10 * 5000 / 32)
        (5000, {"epochCount": 3.3}, 516),  # ceil(3.3 * 5000 / 32) = 515.6...
        (100, {"stepCount": 501}, 501),
        (100, {"stepCount": 100_000}, 100_000),
    ],
)
def test_runs_over_500_steps_are_capped_with_a_warning(prompts, hp, uncapped):
    r = resolve(vertex_request(hp), train=prompts)
    assert r.spec.training.total_steps == 500
    assert len(r.warnings) == 1 and f"gives {uncapped} steps" in str(r.warnings[0])
    assert r.provenance["training.total_steps"].origin == "derived"
    assert "capped at 500" in r.provenance["training.total_steps"].note
    # the epochs trained, after the cap, not the ones asked for
    assert r.spec.training.epochs == pytest.approx(500 * 32 / prompts)


@pytest.mark.parametrize(
    ("lines", "prompts"),
    [
        (1000, 750),  # 25% (250) held out
        (120, 70),  # 50 held out (more than 25% = 30)
        (80, 40),  # 50 wanted, at most half the set
        (4000, 3500),  # 25% = 1000, at most Vertex's 500 validation examples
    ],
)
def test_default_validation_split_counts_the_prompts_that_remain(lines, prompts):
    r = resolve(vertex_request(validation=False), train=lines)
    assert r.dataset_prompts == prompts
    epochs = min(110 * 32 / prompts, 10)
    assert r.spec.training.total_steps == min(math.ceil(round(epochs * prompts / 32, 9)), 500)


@pytest.mark.parametrize(
    ("hp", "error"),
    [
        ({"learningRateMultiplier": 5}, f"{HP}.learningRateMultiplier: 5 is outside [0.25, 4]"),
        ({"learningRateMultiplier": 0.2499}, f"{HP}.learningRateMultiplier: 0.2499 is outside [0.25, 4]"),
        ({"learningRateMultiplier": 4.001}, f"{HP}.learningRateMultiplier: 4.001 is outside [0.25, 4]"),
        ({"maxOutputTokens": 32769}, f"{HP}.maxOutputTokens: 32769 is outside [1, 32768]"),
        ({"maxOutputTokens": 0}, f"{HP}.maxOutputTokens: 0 is outside [1, 32768]"),
        ({"batchSize": 0}, f"{HP}.batchSize: 0 must be >= 1"),
        ({"samplesPerPrompt": 1, "batchSize": 16}, f"{HP}.samplesPerPrompt: 1 must be >= 2"),
        (
            {"batchSize": 3, "samplesPerPrompt": 5},
            f"{HP}.samplesPerPrompt: 5 × batchSize (3) = 15, which is not divisible by 16",
        ),
        (
            {"batchSize": 513, "samplesPerPrompt": 16},
            f"{HP}.samplesPerPrompt: 16 × batchSize (513) = 8,208, which is more than 8,192",
        ),
        ({"epochCount": 0}, f"{HP}.epochCount: 0 must be > 0"),
        ({"stepCount": 0}, f"{HP}.stepCount: 0 must be >= 1"),
        ({"evaluateInterval": 0}, f"{HP}.evaluateInterval: 0 must be >= 1"),
        ({"checkpointInterval": 0}, f"{HP}.checkpointInterval: 0 must be >= 1"),
        ({"thinkingLevel": "NONE"}, f"{HP}.thinkingLevel: 'NONE' is not one of"),
        ({"thinkingBudget": -2}, f"{HP}.thinkingBudget: -2 must be >= -1"),
        ({"adapterSize": "ADAPTER_SIZE_SIXTY_FOUR"}, f"{HP}.adapterSize: 'ADAPTER_SIZE_SIXTY_FOUR' is not one of"),
        ({"epochCount": 2, "stepCount": 5}, f"{HP}.stepCount: 5 is an alternative to epochCount"),
        ({"learningRate": 0.1}, f"{HP}.learningRate: is not a known field"),
    ],
)
def test_out_of_range_values_are_refused_in_the_users_words(hp, error):
    found = problems(vertex_request(hp))
    assert len(found) == 1 and found[0].startswith(error), found


@pytest.mark.parametrize(
    "hp",
    [
        {"learningRateMultiplier": 0.25},
        {"learningRateMultiplier": 4},
        {"maxOutputTokens": 32768},
        {"maxOutputTokens": 1},
        {"batchSize": 1, "samplesPerPrompt": 16},
        {"batchSize": 8, "samplesPerPrompt": 2},
        {"batchSize": 512, "samplesPerPrompt": 16},  # 8,192 exactly
        {"batchSize": 3, "samplesPerPrompt": 16},
        {"epochCount": 0.001},
        {"stepCount": 1, "evaluateInterval": 1, "checkpointInterval": 1},
        {"thinkingLevel": "MINIMAL"},
        {"epochCount": "2"},  # int64 as a JSON string (the proto JSON mapping)
        {"stepCount": "3", "evaluateInterval": "1", "checkpointInterval": "1"},
        {"batchSize": "8", "samplesPerPrompt": "2", "maxOutputTokens": "64"},  # proto3 JSON: any integer as a string
        {"adapterSize": "ADAPTER_SIZE_UNSPECIFIED"},
    ],
)
def test_values_just_inside_the_ranges_resolve(hp):
    assert resolve(vertex_request(hp)).spec.training.total_steps >= 1


def test_every_problem_of_a_request_is_reported_together():
    doc = vertex_request({"learningRateMultiplier": 5, "batchSize": 3, "samplesPerPrompt": 5, "bogus": 1})
    del doc["reinforcementTuningSpec"]["singleRewardConfig"]
    found = problems(doc)
    assert found == [
        f"{HP}.learningRateMultiplier: 5 is outside [0.25, 4]",
        f"{HP}.bogus: is not a known field",
        f"{HP}.samplesPerPrompt: 5 × batchSize (3) = 15, which is not divisible by 16",
        "reinforcementTuningSpec: names no reward: set singleRewardConfig or compositeRewardConfig",
    ]


@pytest.mark.parametrize(
    ("size", "rank"),
    [
        ("ADAPTER_SIZE_ONE", 1),
        ("ADAPTER_SIZE_TWO", 2),
        ("ADAPTER_SIZE_FOUR", 4),
        ("ADAPTER_SIZE_EIGHT", 8),
        ("ADAPTER_SIZE_SIXTEEN", 16),
        ("ADAPTER_SIZE_THIRTY_TWO", 32),
    ],
)
def test_adapter_size_is_the_lora_rank_with_alpha_twice_it(size, rank):
    lora = resolve(vertex_request({"adapterSize": size})).spec.lora
    assert (lora.rank, lora.alpha) == (rank, 2.0 * rank)


@pytest.mark.parametrize(("multiplier", "base"), [(0.25, None), (2, None), (4, 3e-5)])
def test_learning_rate_multiplier_scales_the_base_rate(multiplier, base):
    doc = vertex_request({"learningRateMultiplier": multiplier})
    if base is not None:
        doc["openrft"] = {"base_learning_rate": base}
    spec = resolve(doc).spec
    assert spec.optimizer.lr == pytest.approx(multiplier * (base or DEMO_RATE))
    assert spec.model.base_learning_rate == (base or DEMO_RATE)


def test_unknown_models_get_the_generic_base_rate():
    doc = vertex_request()
    doc["baseModel"] = "Qwen/Qwen2.5-0.5B-Instruct"
    spec = resolve(doc).spec
    assert spec.model.name_or_path == "Qwen/Qwen2.5-0.5B-Instruct" and spec.optimizer.lr == pytest.approx(2e-5)


@pytest.mark.parametrize("model", ["gemini-2.5-flash", "projects/p/locations/us-central1/models/123"])
def test_a_gemini_model_says_it_must_be_mapped(model):
    doc = vertex_request()
    doc["baseModel"] = model
    found = problems(doc)
    assert found == [
        f"baseModel: {model!r} is a model that runs only in its cloud service: map it to a local or Hugging Face "
        f"model with --map-model '{model}=openrft-demo' (or openrft.model_map)"
    ]
    doc["openrft"] = {"model_map": {model: "openrft-demo"}}
    assert resolve(doc).spec.model.name_or_path == "openrft-demo"


@pytest.mark.parametrize(
    ("evaluate", "checkpoint", "warned"),
    [(10, 20, False), (10, 10, False), (10, 25, True), (3, 4, True), (None, 8, False)],
)
def test_checkpoint_interval_not_a_multiple_of_evaluate_interval_is_a_warning(evaluate, checkpoint, warned):
    hp = {"checkpointInterval": checkpoint, **({"evaluateInterval": evaluate} if evaluate else {})}
    r = resolve(vertex_request(hp))
    assert r.spec.checkpoint.interval == checkpoint
    assert bool(r.warnings) is warned
    if warned:
        assert str(r.warnings[0]).startswith(
            f"{HP}.checkpointInterval: {checkpoint} is not a multiple of evaluateInterval ({evaluate})"
        )


def test_intervals_default_to_once_per_epoch_but_at_most_the_run():
    assert resolve(vertex_request({"batchSize": 16}), train=100).spec.evaluation.interval == 7  # ceil(100/16)
    spec = resolve(vertex_request({"batchSize": 16, "stepCount": 3}), train=100).spec
    assert (spec.evaluation.interval, spec.checkpoint.interval) == (3, 3)


def test_a_remote_dataset_needs_step_count_and_intervals():
    doc = vertex_request()
    doc["reinforcementTuningSpec"]["trainingDatasetUri"] = "gs://bucket/train.jsonl"
    with pytest.raises(SpecError) as info:
        resolve_document(doc, base_dir=Path("/jobs"))
    message = str(info.value.problems[0])
    assert message.startswith(
        "reinforcementTuningSpec.trainingDatasetUri: 'gs://bucket/train.jsonl' is not readable here"
    )
    assert "the default epochCount needs its number of prompts" in message and "set stepCount" in message
    doc["reinforcementTuningSpec"]["hyperParameters"] = {
        "stepCount": 12,
        "evaluateInterval": 4,
        "checkpointInterval": 4,
    }
    r = resolve_document(doc, base_dir=Path("/jobs"))
    assert r.spec.training.total_steps == 12 and r.spec.training.epochs is None and r.dataset_prompts is None


def test_dataset_limits():
    assert problems(vertex_request(), train=5001)[0] == (
        "reinforcementTuningSpec.trainingDatasetUri: '/jobs/train.jsonl' holds 5,001 examples; at most 5,000 are "
        "allowed"
    )
    assert problems(vertex_request(), validation=501)[0].startswith(
        "reinforcementTuningSpec.validationDatasetUri: '/jobs/val.jsonl' holds 501 examples; at most 500"
    )
    assert resolve(vertex_request(), train=5000, validation=500).spec.training.total_steps == 110


def test_local_files_are_counted(data_dir):
    r = resolve_document(vertex_request(), base_dir=data_dir)
    assert r.dataset_prompts == 100 and r.spec.training.total_steps == 32
    assert r.spec.data.train == str(data_dir / "train.jsonl")


def test_rewards_single_or_composite_but_not_both():
    scorer = {
        "stringMatchRewardScorer": {
            "stringMatchExpression": {
                "matchOperation": "EXACT_MATCH",
                "expression": "{{references.ground_truth_answer}}",
            }
        }
    }
    composite = {"weightedRewardConfigs": [{"rewardConfig": {"rewardName": "a", **scorer}, "weight": 1}]}
    doc = vertex_request()
    doc["reinforcementTuningSpec"]["compositeRewardConfig"] = composite
    assert problems(doc) == [
        "reinforcementTuningSpec.compositeRewardConfig: is an alternative to singleRewardConfig: set one of them"
    ]
    del doc["reinforcementTuningSpec"]["singleRewardConfig"]
    assert resolve(doc).spec.reward.function == VertexReward(composite=composite)


def test_a_reward_config_needs_one_scorer_and_errors_name_the_users_field():
    doc = vertex_request()
    del doc["reinforcementTuningSpec"]["singleRewardConfig"]
    doc["reinforcementTuningSpec"]["compositeRewardConfig"] = {
        "weightedRewardConfigs": [
            {"rewardConfig": {"rewardName": "a"}, "weight": 1},
            {
                "rewardConfig": {
                    "rewardName": "b",
                    "stringMatchRewardScorer": {
                        "stringMatchExpression": {"matchOperation": "SUBSTRING", "expression": "x"}
                    },
                },
                "weight": 1,
            },
        ]
    }
    found = problems(doc)
    at = "reinforcementTuningSpec.compositeRewardConfig.weightedRewardConfigs"
    assert found[0].startswith(
        f"{at}[0].rewardConfig: {{'rewardName': 'a'}} a reward config needs exactly one of "
        "stringMatchRewardScorer, codeExecutionRewardScorer, cloudRunRewardScorer, "
        "autoraterScorer; got none"
    )
    assert found[1] == (
        f"{at}[1].rewardConfig.stringMatchRewardScorer.stringMatchExpression.matchOperation: "
        "'SUBSTRING' is not one of 'EXACT_MATCH', 'PARTIAL_MATCH', 'REGEX_CONTAINS'"
    )
    assert len(found) == 2


def test_provenance_says_where_each_value_came_from():
    r = resolve(vertex_request({"batchSize": 16, "learningRateMultiplier": 2, "thinkingLevel": "MINIMAL"}))
    p = r.provenance
    assert (p["training.prompts_per_step"].origin, p["training.prompts_per_step"].field) == ("user", f"{HP}.batchSize")
    assert (p["sampling.samples_per_prompt"].origin, p["sampling.samples_per_prompt"].field) == (
        "default",
        f"{HP}.samplesPerPrompt",
    )
    assert p["training.total_steps"].origin == "derived" and p["training.total_steps"].field == f"{HP}.epochCount"
    assert p["training.total_steps"].note == "ceil(epochs × prompts / batchSize) = ceil(10 × 100 / 16) = 63"
    assert p["optimizer.lr"].origin == "derived"
    assert p["optimizer.lr"].note == "learningRateMultiplier 2 × base rate 0.0002"
    assert p["sampling.reasoning_effort"].origin == "user" and r.spec.sampling.reasoning_effort == "minimal"
    assert p["algorithm.clip_ratio_high"].origin == "default" and p["algorithm.clip_ratio_high"].field is None
    assert p["reward.function"].field == "reinforcementTuningSpec.singleRewardConfig"
    assert set(p) >= {"name", "model.name_or_path", "lora.alpha", "evaluation.interval"}


def test_extension_settings_the_request_covers_are_refused():
    doc = vertex_request()
    doc["openrft"] = {"lora_rank": 4, "max_new_tokens": 8, "device": "cpu"}
    assert problems(doc) == [
        f"openrft.lora_rank: 4 is set by {HP}.adapterSize in a Vertex job; set it there",
        f"openrft.max_new_tokens: 8 is set by {HP}.maxOutputTokens in a Vertex job; set it there",
    ]


@pytest.mark.parametrize(
    ("hp", "effort", "origin"),
    [
        ({}, "high", "default"),
        ({"thinkingLevel": "MINIMAL"}, "minimal", "user"),
        ({"thinkingLevel": "LOW"}, "low", "user"),
        ({"thinkingLevel": "MEDIUM"}, "medium", "user"),
        ({"thinkingLevel": "HIGH"}, "high", "user"),
        ({"thinkingLevel": "REINFORCEMENT_TUNING_THINKING_LEVEL_UNSPECIFIED"}, "high", "default"),
        ({"thinkingBudget": 0}, None, "user"),  # 0: no thinking
        ({"thinkingBudget": -1}, "high", "user"),  # -1: dynamic thinking
        ({"thinkingBudget": 1024}, "high", "user"),
        ({"thinkingLevel": "LOW", "thinkingBudget": 0}, "low", "user"),  # the level wins, the budget is ignored
    ],
)
def test_every_thinking_level_of_the_rest_enum_and_the_thinking_budget(hp, effort, origin):
    r = resolve(vertex_request(hp))
    assert r.spec.sampling.reasoning_effort == effort
    assert r.provenance["sampling.reasoning_effort"].origin == origin
    warned = [str(w) for w in r.warnings if "thinkingBudget" in str(w)]
    assert bool(warned) == (hp.get("thinkingBudget", 0) > 0 or ("thinkingLevel" in hp and "thinkingBudget" in hp))


def test_int64_fields_written_as_strings_count_as_numbers():
    r = resolve(vertex_request({"epochCount": "3", "batchSize": "10"}), train=100)
    assert r.spec.training.epochs == 3 and r.spec.training.total_steps == 30  # ceil(3 × 100 / 10)
    r = resolve(vertex_request({"stepCount": "7", "evaluateInterval": "7", "checkpointInterval": "7"}))
    assert r.spec.training.total_steps == 7


def test_request_fields_of_the_tuning_job_resource_are_accepted():
    doc = vertex_request()
    doc.update(
        outputUri="gs://bucket/out",
        serviceAccount="tuner@project.iam.gserviceaccount.com",
        encryptionSpec={"kmsKeyName": "projects/p/locations/l/keyRings/r/cryptoKeys/k"},
    )
    r = resolve(doc)
    assert r.spec.output_dir == "gs://bucket/out"
    warned = sorted(w.path for w in r.warnings)
    assert warned == ["encryptionSpec", "serviceAccount"]
