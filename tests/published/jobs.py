"""The corpus of published job shapes (fixtures in jobs/, sources in README.md): how each is run here.

Each case names the mappings a user passes to run the job as published (``--map``, ``--map-model``,
``--map-lambda``), the same job written directly with those local values in its own fields, and values the
resolved job must have (the service's rules applied to the fixture's numbers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TRAIN = str(ROOT / "examples" / "arithmetic" / "train.jsonl")  # 2,000 prompts
VALIDATION = str(ROOT / "examples" / "arithmetic" / "validation.jsonl")  # 200 prompts
LAMBDA_URL = "http://127.0.0.1:9/corpus-reward"
CLOUD_RUN_URL = "http://127.0.0.1:9/corpus-cloud-run"
DEMO = "openrft-demo"
DEMO_RATE = 2e-4  # openrft-demo's base learning rate


@dataclass(frozen=True)
class PublishedJob:
    file: str
    source: str
    replace: dict[str, str] = field(default_factory=dict)  # --map FROM=TO
    models: dict[str, str] = field(default_factory=dict)  # --map-model NAME=TARGET
    lambdas: dict[str, str] = field(default_factory=dict)  # --map-lambda [ARN=]TARGET ("*": the job's one Lambda)
    direct: dict[str, Any] = field(default_factory=dict)  # the same job with local values written in its fields
    expect: dict[str, Any] = field(default_factory=dict)  # canonical path -> value

    @property
    def path(self) -> Path:
        return HERE / "jobs" / self.file

    def cli_options(self) -> list[str]:
        options = [f"--map={k}={v}" for k, v in self.replace.items()]
        options += [f"--map-model={k}={v}" for k, v in self.models.items()]
        options += [f"--map-lambda={v}" if k == "*" else f"--map-lambda={k}={v}" for k, v in self.lambdas.items()]
        return options


HYPERPOD = "github.com/aws/sagemaker-hyperpod-recipes"
JOBS = [
    PublishedJob(
        "nova_hyperpod_lora_rft.yaml",
        f"{HYPERPOD}: recipes_collection/recipes/fine-tuning/nova/nova_2_0/nova_lite/RFT/"
        "nova_lite_2_0_p5_gpu_lora_rft.yaml",
        replace={"s3://corpus-bucket/arithmetic/train.jsonl": TRAIN},
        models={"nova-lite-2/prod": DEMO},
        lambdas={"*": LAMBDA_URL},
        direct={"run.data_s3_path": TRAIN, "run.model_name_or_path": DEMO, "run.reward_lambda_arn": LAMBDA_URL},
        expect={
            "training.total_steps": 6,
            "training.prompts_per_step": 4,
            "optimizer.lr": 7e-7,
            "lora.alpha": 32.0,
            "lora.lora_plus_lr_ratio": 64.0,
            "rollout.strategy": "off_policy_async",
            "checkpoint.interval": 6,
            "model.base_learning_rate": DEMO_RATE,
        },
    ),
    PublishedJob(
        "nova_samples_rft_lora.yaml",
        "github.com/aws-samples/amazon-nova-samples: customization/Nova_2.0/SFT_RFT/nova_2_0_recipies/RFT/"
        "rft-lora.yaml",
        replace={"s3://corpus-bucket/arithmetic/train.jsonl": TRAIN},
        models={"amazon.nova-2-lite-v1:0:256k": DEMO},
        lambdas={"*": LAMBDA_URL},
        direct={
            "run.data_s3_path": TRAIN,
            "run.model_name_or_path": DEMO,
            "training_config.rollout.rewards.api_endpoint.lambda_arn": LAMBDA_URL,
        },
        expect={
            "training.total_steps": 5,
            "training.prompts_per_step": 8,
            "optimizer.lr": 1e-4,
            "algorithm.kl_loss_coef": 0.001,
            "sampling.reasoning_effort": "low",
            "model.base_learning_rate": DEMO_RATE,
        },
    ),
    PublishedJob(
        "bedrock_customization_job.json",
        "github.com/aws-samples/amazon-bedrock-samples: custom-models/bedrock-reinforcement-fine-tuning/models/nova/"
        "nova_gsm8k_rft.ipynb (create_model_customization_job), and the Bedrock API reference of "
        "CreateModelCustomizationJob",
        replace={
            "s3://corpus-bucket/rft-data/train.jsonl": TRAIN,
            "s3://corpus-bucket/rft-data/val.jsonl": VALIDATION,
        },
        models={"arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-2-lite-v1:0:256k": DEMO},
        lambdas={"arn:aws:lambda:us-east-1:111122223333:function:corpus-reward": LAMBDA_URL},
        direct={
            "trainingDataConfig.s3Uri": TRAIN,
            "validationDataConfig.validators.0.s3Uri": VALIDATION,
            "baseModelIdentifier": DEMO,
            "customizationConfig.rftConfig.graderConfig.lambdaGrader.lambdaArn": LAMBDA_URL,
        },
        expect={
            "training.prompts_per_step": 4,
            "training.total_steps": 1000,  # ceil(2 epochs x 2,000 prompts / 4)
            "optimizer.lr": 1e-5,
            "sampling.max_length": 272,
            "evaluation.interval": 5,
        },
    ),
    PublishedJob(
        "bedrock_openai_compatible_job.json",
        "github.com/aws-samples/amazon-bedrock-samples: custom-models/bedrock-reinforcement-fine-tuning/models/"
        "gpt-oss/gptoss_gsm8k_rft.ipynb (client.fine_tuning.jobs.create with a lambda grader)",
        replace={"file-CorpusBedrockTrain01": TRAIN},
        models={"openai.gpt-oss-20b": DEMO},
        lambdas={"arn:aws:lambda:us-west-2:111122223333:function:corpus-reward": LAMBDA_URL},
        direct={"training_file": TRAIN, "model": DEMO, "method.reinforcement.grader.lambda.function": LAMBDA_URL},
        expect={"optimizer.lr": 1.0 * DEMO_RATE, "training.prompts_per_step": 8, "model.base_learning_rate": DEMO_RATE},
    ),
    PublishedJob(
        "vertex_quickstart_cloud_run.json",
        "cloud.google.com Vertex AI reinforcement tuning quick start: the tuningJobs request body",
        replace={
            "gs://corpus-bucket/rft/train.jsonl": TRAIN,
            "gs://corpus-bucket/rft/eval.jsonl": VALIDATION,
            "https://corpus-reward-abc123-uc.a.run.app": CLOUD_RUN_URL,
        },
        models={"gemini-3.5-flash": DEMO},
        direct={
            "reinforcementTuningSpec.trainingDatasetUri": TRAIN,
            "reinforcementTuningSpec.validationDatasetUri": VALIDATION,
            "reinforcementTuningSpec.singleRewardConfig.cloudRunRewardScorer.cloudRunUri": CLOUD_RUN_URL,
            "baseModel": DEMO,
        },
        expect={
            "optimizer.lr": 2.0 * DEMO_RATE,  # learningRateMultiplier 2 x the mapped model's base rate
            "model.base_learning_rate": DEMO_RATE,
            "lora.rank": 8,
            "lora.alpha": 16.0,
            "training.total_steps": 500,  # ceil(3 x 2,000 / 4) = 1,500, capped at Vertex's 500
        },
    ),
    PublishedJob(
        "vertex_proto_names_code_execution.json",
        "github.com/googleapis/python-genai: tests of tunings with a reinforcement tuning spec (proto field names, "
        "as the SDK and gcloud write them), and the REST reference's compositeRewardConfig",
        replace={"gs://corpus-bucket/rft/train.jsonl": TRAIN},
        models={"gemini-2.5-flash": DEMO},
        direct={"reinforcement_tuning_spec.training_dataset_uri": TRAIN, "base_model": DEMO},
        expect={
            "optimizer.lr": 0.5 * DEMO_RATE,
            "lora.rank": 4,
            "sampling.reasoning_effort": "minimal",
            "training.epochs": 2000 / 1500,  # capped at 500 steps: 500 x 4 / 1,500 training prompts
            "training.total_steps": 500,
        },
    ),
    PublishedJob(
        "openai_cookbook_score_model.json",
        "github.com/openai/openai-cookbook: examples/Reinforcement_Fine_Tuning.ipynb (the job payload with a "
        "score_model grader)",
        replace={"file-CorpusCookbookTrain1": TRAIN, "file-CorpusCookbookValid1": VALIDATION},
        models={"o4-mini-2025-04-16": DEMO},
        direct={"training_file": TRAIN, "validation_file": VALIDATION, "model": DEMO},
        expect={
            "optimizer.lr": DEMO_RATE,
            "sampling.samples_per_prompt": 4,  # compute_multiplier 0.25 x 16
            "training.total_steps": 125,  # ceil(2 epochs x 2,000 / 32 (batch_size auto))
            "evaluation.interval": 3,
            "evaluation.samples_per_prompt": 2,
            "training.seed": 42,
        },
    ),
    PublishedJob(
        "openai_rft_guide_multi_grader.json",
        "platform.openai.com/docs/guides/reinforcement-fine-tuning (a multi grader over sample.output_json with a "
        "json_schema response_format) and the graders guide's multigrader",
        replace={"file-CorpusGuideTrain001": TRAIN},
        models={"o4-mini-2025-04-16": DEMO},
        direct={"training_file": TRAIN, "model": DEMO},
        expect={"optimizer.lr": DEMO_RATE, "training.prompts_per_step": 4, "sampling.reasoning_effort": "low"},
    ),
]
