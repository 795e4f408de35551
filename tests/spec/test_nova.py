"""The Nova recipe (docs/contracts.md §1) and Bedrock's request for the same job."""

from __future__ import annotations

from pathlib import Path

import pytest
from dialect_builders import Sizes, nova_recipe

from openrft.spec.dialects import detect_dialect, resolve_document
from openrft.spec.errors import SpecError
from openrft.spec.rewards import NovaLambdaReward, PresetReward

TRAINER = "training_config.trainer"
URL = "http://127.0.0.1:8080/"  # a server implementing the Nova reward contract (examples/reward_server)
AWS_ARN = "arn:aws:lambda:us-east-1:123456789012:function:reward"


def resolve(doc, train=1000, validation=10):
    return resolve_document(doc, base_dir=Path("/jobs"), dataset_size=Sizes(train, validation))


def problems(doc) -> list[str]:
    with pytest.raises(SpecError) as info:
        resolve(doc)
    return [str(p) for p in info.value.problems]


SEED_RECIPE = {
    "run": {
        "name": "my-rft-run",
        "model_type": "amazon.nova-2-lite-v1:0:256k",
        "model_name_or_path": "openrft-demo",
        "data_s3_path": "train.jsonl",
        "replicas": 4,
        "generation_replicas": 2,
        "mlflow_tracking_uri": "http://127.0.0.1:5000",
        "mlflow_experiment_name": "exp",
        "mlflow_run_name": "r1",
    },
    "training_config": {
        "max_length": 8192,
        "global_batch_size": 32,
        "reasoning_effort": "high",
        "data": {"shuffle": True},
        "rollout": {
            "rollout_strategy": {"type": "off_policy_async", "age_tolerance": 2},
            "advantage_strategy": {"number_generation": 4},
            "generator": {"max_new_tokens": 6000, "set_random_seed": True, "temperature": 1, "top_k": 1},
            "rewards": {
                "preset_reward_function": None,
                "api_endpoint": {"lambda_arn": URL, "lambda_concurrency_limit": 12, "lambda_batch_size": 128},
            },
        },
        "trainer": {
            "max_steps": 2,
            "save_steps": 5,
            "test_steps": 1,
            "refit_freq": 4,
            "clip_ratio_high": 0.2,
            "loss_scale": 1.0,
            "ent_coeff": 0.0,
            "kl_loss_coef": 0.0,
            "optim_config": {"lr": 1e-6, "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.95},
            "peft": {"peft_scheme": "lora", "lora_tuning": {"alpha": 64, "lora_plus_lr_ratio": 64.0}},
            "adaptive_curriculum": {
                "enable": False,
                "selection_pool_multiplier": 8,
                "prediction_mode": "pass_rate",
                "exemplar_history_steps": 1,
                "reinforce_coef": 0.01,
                "predictor_prompt_column": "predictor_prompt",
                "selection_lookahead_steps": 4,
            },
        },
    },
}


def test_the_seed_documents_recipe_resolves_field_by_field():
    r = resolve(SEED_RECIPE)
    s = r.spec
    assert (s.name, s.dialect, s.metadata) == ("my-rft-run", "nova", {"model_type": "amazon.nova-2-lite-v1:0:256k"})
    assert (s.training.prompts_per_step, s.sampling.samples_per_prompt, s.training.total_steps) == (8, 4, 2)
    assert (s.sampling.max_length, s.sampling.max_new_tokens, s.sampling.top_k) == (8192, 6000, 1)
    assert s.sampling.reasoning_effort == "high" and s.data.shuffle is True
    assert (s.rollout.strategy, s.rollout.age_tolerance) == ("off_policy_async", 2)
    assert (s.rollout.replicas, s.rollout.generation_replicas) == (4, 2)
    assert (s.optimizer.lr, s.optimizer.adam_beta2, s.lora.alpha, s.lora.lora_plus_lr_ratio) == (1e-6, 0.95, 64, 64)
    # test_steps counts reference updates (refit_freq steps each): validation every 1 × 4 steps
    assert (s.algorithm.refit_freq, s.evaluation.interval, s.checkpoint.interval) == (4, 4, 5)
    assert s.reward.function == NovaLambdaReward(endpoint=URL, batch_size=128, concurrency_limit=12)
    assert (s.tracking.mlflow_tracking_uri, s.tracking.mlflow_experiment_name, s.tracking.mlflow_run_name) == (
        "http://127.0.0.1:5000",
        "exp",
        "r1",
    )
    # 2 steps of 8 prompts over 750 training prompts (1000 lines, 250 held out)
    assert r.dataset_prompts == 750 and s.training.epochs == pytest.approx(16 / 750)
    assert r.provenance["training.prompts_per_step"].note.startswith("global_batch_size / number_generation = 32 / 4")


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"global_batch_size": 512}, "training_config.global_batch_size: 512 is outside [16, 256]"),
        ({"reasoning_effort": "medium"}, "training_config.reasoning_effort: 'medium' is not one of 'high', 'low'"),
        (
            {"trainer": {"max_steps": 2, "optim_config": {"weight_decay": 1.01}}},
            f"{TRAINER}.optim_config.weight_decay: 1.01 is outside [0, 1]",
        ),
        (
            {"trainer": {"max_steps": 2, "optim_config": {"weight_decay": -0.01}}},
            f"{TRAINER}.optim_config.weight_decay: -0.01 is outside [0, 1]",
        ),
        (
            {"trainer": {"max_steps": 2, "peft": {"lora_tuning": {"lora_plus_lr_ratio": 100.5}}}},
            f"{TRAINER}.peft.lora_tuning.lora_plus_lr_ratio: 100.5 is outside [0, 100]",
        ),
        (
            {"trainer": {"max_steps": 2, "adaptive_curriculum": {"selection_pool_multiplier": 33}}},
            f"{TRAINER}.adaptive_curriculum.selection_pool_multiplier: 33 must be <= 32",
        ),
        (
            {"trainer": {"max_steps": 2, "adaptive_curriculum": {"selection_lookahead_steps": 17}}},
            f"{TRAINER}.adaptive_curriculum.selection_lookahead_steps: 17 must be <= 16",
        ),
        (
            {"trainer": {"max_steps": 2, "adaptive_curriculum": {"enable": True}}},
            f"{TRAINER}.adaptive_curriculum.enable: True is not supported yet by OpenRFT's engine",
        ),
        (
            {
                "rollout": {
                    "advantage_strategy": {"number_generation": 3},
                    "rewards": {"preset_reward_function": "exact_match"},
                }
            },
            "training_config.global_batch_size: 32 is not a multiple of "
            "rollout.advantage_strategy.number_generation (3)",
        ),
        (
            {
                "rollout": {
                    "rollout_strategy": {"type": "sync", "age_tolerance": 2},
                    "rewards": {"preset_reward_function": "exact_match"},
                }
            },
            "training_config.rollout.rollout_strategy.age_tolerance: 2 needs "
            "training_config.rollout.rollout_strategy.type: off_policy_async",
        ),
        ({"rollout": {"rewards": {}}}, "training_config.rollout.rewards: names no reward"),
    ],
)
def test_recipe_errors_name_the_yaml_path(change, error):
    found = problems(nova_recipe(change))
    assert len(found) == 1 and found[0].startswith(error), found


@pytest.mark.parametrize(
    "change",
    [
        {"global_batch_size": 16},
        {"global_batch_size": 256},
        {"reasoning_effort": None},
        {"reasoning_effort": "low"},
        {"trainer": {"max_steps": 1, "optim_config": {"weight_decay": 1}}},
        {"trainer": {"max_steps": 1, "peft": {"lora_tuning": {"lora_plus_lr_ratio": 100}}}},
        {"trainer": {"max_steps": 1, "peft": {"lora_tuning": {"lora_plus_lr_ratio": 0}}}},
        {"trainer": {"max_steps": 1, "adaptive_curriculum": {"enable": False, "selection_pool_multiplier": 32}}},
        {
            "trainer": {
                "max_steps": 1,
                "adaptive_curriculum": {"selection_pool_multiplier": 1, "selection_lookahead_steps": 16},
            }
        },
        {"trainer": {"max_steps": 1, "refit_freq": 0}},
    ],
)
def test_values_just_inside_the_ranges_resolve(change):
    assert resolve(nova_recipe(change)).spec.dialect == "nova"


def test_all_recipe_problems_are_reported_together():
    doc = nova_recipe(
        {"global_batch_size": 8, "reasoning_effort": "medium"},
        {"optim_config": {"weight_decay": 2}, "adaptive_curriculum": {"enable": True}},
    )
    assert [p.split(":")[0] for p in problems(doc)] == [
        "training_config.global_batch_size",
        "training_config.reasoning_effort",
        f"{TRAINER}.optim_config.weight_decay",
        f"{TRAINER}.adaptive_curriculum.enable",
    ]


def test_rewards_preset_endpoint_or_lambda_arn():
    assert resolve(nova_recipe()).spec.reward.function == PresetReward(name="exact_match")
    doc = nova_recipe({"rollout": {"rewards": {}}}, run={"reward_lambda_arn": URL})
    assert resolve(doc).spec.reward.function == NovaLambdaReward(endpoint=URL)
    doc = nova_recipe(
        {"rollout": {"rewards": {"api_endpoint": {"lambda_arn": URL, "lambda_batch_size": 7}}}},
        run={"reward_lambda_arn": URL},
    )
    assert resolve(doc).spec.reward.function == NovaLambdaReward(endpoint=URL, batch_size=7, concurrency_limit=12)
    doc["run"]["reward_lambda_arn"] = "http://127.0.0.1:9/other"
    assert problems(doc)[0].startswith("run.reward_lambda_arn: 'http://127.0.0.1:9/other' differs from")
    both = nova_recipe(
        {"rollout": {"rewards": {"preset_reward_function": "exact_match", "api_endpoint": {"lambda_arn": URL}}}}
    )
    assert problems(both)[0].startswith(
        "training_config.rollout.rewards.api_endpoint: is an alternative to preset_reward_function"
    )


ARN_ERROR = (
    f"{AWS_ARN!r} is an AWS Lambda, and no AWS credentials are configured to invoke it: map it to a local handler "
    f"or endpoint with --map-lambda '{AWS_ARN}=reward.py:lambda_handler' (a file, or an http:// URL), or "
    "openrft.lambda_map"
)


@pytest.mark.parametrize(
    ("rewards", "run", "field"),
    [
        ({"api_endpoint": {"lambda_arn": AWS_ARN}}, {}, "training_config.rollout.rewards.api_endpoint.lambda_arn"),
        ({}, {"reward_lambda_arn": AWS_ARN}, "run.reward_lambda_arn"),
    ],
)
def test_an_aws_lambda_arn_without_credentials_is_refused_with_the_other_problems(rewards, run, field):
    doc = nova_recipe({"rollout": {"rewards": rewards, "generator": {"temperature": -1}}}, run=run)
    assert problems(doc) == [
        "training_config.rollout.generator.temperature: -1 must be >= 0.0",
        f"{field}: {ARN_ERROR}",
    ]


def test_off_policy_age_defaults_to_two_and_sync_is_age_zero():
    spec = resolve(
        nova_recipe(
            {
                "rollout": {
                    "rollout_strategy": {"type": "off_policy_async"},
                    "rewards": {"preset_reward_function": "exact_match"},
                }
            }
        )
    ).spec
    assert (spec.rollout.strategy, spec.rollout.age_tolerance) == ("off_policy_async", 2)
    assert resolve(nova_recipe()).spec.rollout.age_tolerance == 0


def test_random_seed_when_set_random_seed_is_false():
    doc = nova_recipe(
        {"rollout": {"generator": {"set_random_seed": False}, "rewards": {"preset_reward_function": "exact_match"}}}
    )
    seeds = {resolve(doc).spec.training.seed for _ in range(5)}
    assert len(seeds) > 1
    assert resolve(nova_recipe()).spec.training.seed == 0


def test_extensions_the_recipe_covers_are_refused():
    doc = nova_recipe(openrft={"max_length": 100, "lora_rank": 4})
    doc["openrft"] = {"max_length": 100, "lora_rank": 4}
    assert problems(doc) == ["openrft.max_length: 100 is set by training_config.max_length in a Nova job; set it there"]
    del doc["openrft"]["max_length"]
    assert resolve(doc).spec.lora.rank == 4


# Bedrock's request ------------------------------------------------------------------------------

BEDROCK_HP = {
    "epochCount": 2,
    "batchSize": 64,
    "learningRate": 1e-5,
    "maxPromptLength": 1024,
    "trainingSamplePerPrompt": 8,
    "inferenceMaxTokens": 512,
    "reasoningEffort": "medium",
    "evalInterval": 5,
}


def bedrock(nested: bool, hp=None, **top):
    blocks = {"hyperParameters": BEDROCK_HP if hp is None else hp, "graderConfig": {"lambdaGrader": {"lambdaArn": URL}}}
    doc = {
        "jobName": "bedrock-job",
        "baseModelIdentifier": "openrft-demo",
        "customizationType": "REINFORCEMENT_FINE_TUNING",
        "roleArn": "arn:aws:iam::1:role/x",
        "trainingDataConfig": {"s3Uri": "train.jsonl"},
        "validationDataConfig": {"validators": [{"s3Uri": "val.jsonl"}]},
        "outputDataConfig": {"s3Uri": "out/"},
        **top,
    }
    return {**doc, "customizationConfig": {"rftConfig": blocks}} if nested else {**doc, **blocks}


@pytest.mark.parametrize("nested", [False, True])
def test_bedrock_request_in_either_shape(nested):
    doc = bedrock(nested)
    assert detect_dialect(doc) == "nova"
    r = resolve(doc, train=1000)
    s = r.spec
    # batchSize counts samples, like global_batch_size: 64 / 8 = 8 prompts; ceil(2 * 1000 / 8) = 250 steps
    assert (s.training.prompts_per_step, s.sampling.samples_per_prompt, s.training.total_steps) == (8, 8, 250)
    assert (s.optimizer.lr, s.evaluation.interval, s.sampling.reasoning_effort) == (1e-5, 5, "medium")
    assert (s.sampling.max_new_tokens, s.sampling.max_length) == (512, 1536)
    assert s.reward.function == NovaLambdaReward(endpoint=URL)
    assert (s.name, s.output_dir, s.data.validation) == ("bedrock-job", "/jobs/out", "/jobs/val.jsonl")
    assert s.lora.alpha == 64 and s.checkpoint.interval == 5  # the recipe's defaults for what Bedrock lacks
    assert [str(w) for w in r.warnings] == ["roleArn: is an AWS setting; OpenRFT ignores it"]


def test_bedrock_values_may_be_strings_and_defaults_are_the_recipes():
    s = resolve(bedrock(False, {"epochCount": "1", "learningRate": "2e-6"}), train=800).spec
    assert (s.training.total_steps, s.optimizer.lr) == (100, 2e-6)  # 32 / 4 = 8 prompts per step
    assert (s.sampling.max_new_tokens, s.sampling.max_length, s.evaluation.interval) == (6000, 8192, 1)


@pytest.mark.parametrize(
    ("hp", "error"),
    [
        ({"batchSize": 15}, "hyperParameters.batchSize: 15 is outside [16, 512]"),
        ({"batchSize": 513}, "hyperParameters.batchSize: 513 is outside [16, 512]"),
        ({"epochCount": 51}, "hyperParameters.epochCount: 51 is outside [1, 50]"),
        ({"learningRate": 2e-3}, "hyperParameters.learningRate: 0.002 is outside [1e-07, 0.001]"),
        ({"trainingSamplePerPrompt": 17}, "hyperParameters.trainingSamplePerPrompt: 17 is outside [2, 16]"),
        ({"evalInterval": 101}, "hyperParameters.evalInterval: 101 is outside [1, 100]"),
        ({"batchSize": 18}, "hyperParameters.batchSize: 18 is not a multiple of trainingSamplePerPrompt (4)"),
    ],
)
def test_bedrock_ranges(hp, error):
    found = problems(bedrock(False, hp))
    assert len(found) == 1 and found[0].startswith(error), found


@pytest.mark.parametrize(
    "hp",
    [
        {"batchSize": 16},
        {"batchSize": 512},
        {"epochCount": 1},
        {"epochCount": 50},
        {"learningRate": 1e-7},
        {"learningRate": 1e-3},
        {"trainingSamplePerPrompt": 2},
        {"trainingSamplePerPrompt": 16, "batchSize": 32},
        {"evalInterval": 1},
        {"evalInterval": 100},
    ],
)
def test_bedrock_values_just_inside_the_ranges_resolve(hp):
    assert resolve(bedrock(False, hp)).spec.training.total_steps >= 1


def test_bedrock_refuses_an_aws_lambda_arn_with_the_other_problems():
    doc = bedrock(True, {**BEDROCK_HP, "batchSize": 15})
    doc["customizationConfig"]["rftConfig"]["graderConfig"]["lambdaGrader"]["lambdaArn"] = AWS_ARN
    assert problems(doc) == [
        "customizationConfig.rftConfig.hyperParameters.batchSize: 15 is outside [16, 512]",
        f"customizationConfig.rftConfig.graderConfig.lambdaGrader.lambdaArn: {ARN_ERROR}",
    ]


def test_bedrock_blocks_in_both_places_are_refused():
    doc = bedrock(True)
    doc["hyperParameters"] = BEDROCK_HP
    assert problems(doc) == [
        "hyperParameters: is also given under customizationConfig.rftConfig: write it in one place"
    ]


@pytest.mark.parametrize(
    ("trainer", "interval"),
    [
        ({"test_steps": 1, "refit_freq": 4}, 4),  # Nova: validation every N reference-model updates
        ({"test_steps": 3, "refit_freq": 5}, 15),
        ({"test_steps": 2}, 8),  # refit_freq's default 4
        ({"test_steps": 3, "refit_freq": 0}, 3),  # no reference updates (OpenRFT): every test_steps steps
    ],
)
def test_test_steps_count_reference_model_updates(trainer, interval):
    r = resolve(nova_recipe(trainer=trainer))
    assert r.spec.evaluation.interval == interval
    assert r.provenance["evaluation.interval"].field == f"{TRAINER}.test_steps"


def test_settings_that_do_nothing_or_stop_learning_are_warned():
    quiet = resolve(nova_recipe())
    assert quiet.warnings == []
    r = resolve(
        nova_recipe(
            {"rollout": {"rewards": {"preset_reward_function": "exact_match"}, "generator": {"top_k": 1}}},
            run={"rollout_worker_replicas": 2, "generation_replicas": 3},
        )
    )
    warnings = {w.path: str(w) for w in r.warnings}
    assert set(warnings) == {
        "training_config.rollout.generator.top_k",
        "run.rollout_worker_replicas",
        "run.generation_replicas",
    }
    assert "every advantage is 0" in warnings["training_config.rollout.generator.top_k"]
    assert "is not used by OpenRFT" in warnings["run.rollout_worker_replicas"]
    assert "no effect with the sync rollout strategy" in warnings["run.generation_replicas"]
    # generation replicas serve off_policy_async: no warning there
    async_recipe = nova_recipe(
        {
            "rollout": {
                "rewards": {"preset_reward_function": "exact_match"},
                "rollout_strategy": {"type": "off_policy_async"},
            }
        },
        run={"generation_replicas": 3},
    )
    assert resolve(async_recipe).warnings == []


def test_ppo_mini_batches_in_the_openrft_block():
    r = resolve(nova_recipe(openrft={"ppo_mini_batches": 2}))
    assert r.spec.algorithm.ppo_mini_batches == 2
    assert r.provenance["algorithm.ppo_mini_batches"].field == "openrft.ppo_mini_batches"
    assert any(
        "ppo_mini_batches" in p and "more than the prompts of a step" in p
        for p in problems(nova_recipe(openrft={"ppo_mini_batches": 9}))  # 32 samples / 4 = 8 prompts
    )


def test_ignore_eos_in_the_openrft_block():
    assert resolve(nova_recipe()).spec.sampling.ignore_eos is False
    r = resolve(nova_recipe(openrft={"ignore_eos": True}))
    assert r.spec.sampling.ignore_eos is True
    assert r.provenance["sampling.ignore_eos"].field == "openrft.ignore_eos"
