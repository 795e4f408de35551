"""The canonical job spec: one fully resolved description of an RFT job, whatever dialect it came from.

Every default is applied and every derived value computed by the dialect that built it, so the
engine never looks at user input. Dialects (``spec.dialects``) are the only writers.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from openrft.spec.agents import AgentSpec
from openrft.spec.rewards import RewardSpec
from openrft.spec.tools import ToolsSpec
from openrft.spec.urls import HttpUrl, Location, OperatorUrl, OutboundUrl

# Upper bounds of the numeric settings (docs/hyperparameters.md, "Bounds"): the services' where they publish
# them, else what one machine and a small model can run. A job outside them is refused at submission.
MAX_SEED = 2**32 - 1  # numpy's seed range
MAX_LORA_RANK = 512
MAX_MICRO_BATCH_TOKENS = 1 << 20
MAX_SAMPLES_PER_PROMPT = 512
MAX_TEMPERATURE = 2.0  # Vertex's and OpenAI's sampling temperature range
MAX_EXAMPLES = 10_000_000
MAX_THREADS = 1024
MAX_LENGTH = 131_072  # the longest context of the supported model families
MAX_NEW_TOKENS = 32_768  # Vertex's maxOutputTokens
MAX_AGE_TOLERANCE = 64
MAX_REPLICAS = 64
MAX_PRIORITY = 100  # a job's priority among its tenant's queued jobs: [-100, 100]
MAX_STEPS = 100_000
MAX_PPO_MINI_BATCHES = 1024
MAX_LEARNING_RATE = 1.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Strict):
    """The base model: a registered name (``openrft-demo``), a local path, or a Hugging Face id."""

    name_or_path: str
    revision: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16", "float64"] = "auto"  # float64: numerical checks
    base_learning_rate: float = Field(
        2e-5, gt=0, le=MAX_LEARNING_RATE, description="the rate learningRateMultiplier scales"
    )


def held_out_count(total: int, fraction: float, minimum: int, maximum: int | None = None) -> int:
    """Examples held out of a training set of ``total`` for validation: ``max(round(fraction * total), minimum)``,
    capped by ``maximum`` and at half the set (Vertex's rule with its defaults)."""
    count = max(round(fraction * total), minimum)
    if maximum is not None:
        count = min(count, maximum)
    return min(count, total // 2)


class DataSpec(_Strict):
    """Datasets, messages or Vertex format (detected per file). With no validation file, a part of the
    training file is held out (``held_out_count``)."""

    train: Location = Field(description="path or URI of the training JSONL")
    validation: Location | None = None
    shuffle: bool = True
    validation_fraction: float = Field(0.25, ge=0, lt=1, description="held out of train when validation is None")
    validation_min_examples: int = Field(
        50, ge=0, le=MAX_EXAMPLES, description="held out at least this many (Vertex's rule)"
    )
    validation_max_examples: int | None = Field(None, ge=1, le=MAX_EXAMPLES)
    max_train_examples: int | None = Field(
        None, ge=1, le=MAX_EXAMPLES, description="train on the first N examples only"
    )
    train_examples_limit: int | None = Field(
        None, ge=1, description="a training file with more examples is rejected (Vertex: 5,000; Bedrock: 20,000)"
    )
    validation_examples_limit: int | None = Field(
        None, ge=1, description="a validation file with more examples is rejected (Vertex: 500)"
    )

    def held_out(self, total: int) -> int:
        """How many of ``total`` training examples are held out for validation (0 with a validation file)."""
        if self.validation:
            return 0
        return held_out_count(
            total, self.validation_fraction, self.validation_min_examples, self.validation_max_examples
        )

    def train_prompts(self, total: int) -> int:
        """Prompts the job trains on, of a training file of ``total`` examples: the steps of an epoch count these."""
        count = total - self.held_out(total)
        return min(count, self.max_train_examples) if self.max_train_examples else count


class SamplingSpec(_Strict):
    """How completions are sampled, for training rollouts and (unless overridden) evaluation."""

    samples_per_prompt: int = Field(4, ge=1, le=MAX_SAMPLES_PER_PROMPT)
    max_new_tokens: int = Field(256, ge=1, le=MAX_NEW_TOKENS)
    max_length: int = Field(
        8192, ge=2, le=MAX_LENGTH, description="prompt + response tokens; longer prompts are rejected"
    )
    temperature: float = Field(1.0, ge=0, le=MAX_TEMPERATURE)
    top_k: int = Field(0, ge=0, le=1_000_000, description="0 = off")
    top_p: float = Field(1.0, gt=0, le=1)
    min_p: float = Field(0.0, ge=0, lt=1, description="0 = off; tokens below min_p x the top probability dropped")
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    ignore_eos: bool = Field(
        False, description="sample end tokens like any other: every answer runs to max_new_tokens (benchmarks)"
    )


class RolloutCorrectionSpec(_Strict):
    """Importance weights between the generation engine's log-probs and the learner's (docs/algorithm.md)."""

    mode: Literal["auto", "off", "tis", "mis"] = Field(
        "auto",
        description="tis: truncated IS weights min(rho, cap); mis: tokens (or sequences) with rho outside "
        "[1/cap, cap] masked; off: none; auto: tis when an engine other than the learner's model generates",
    )
    level: Literal["token", "sequence"] = Field(
        "token", description="sequence: one ratio per sequence, exp of the mean token log-ratio"
    )
    cap: float = Field(2.0, gt=1, le=1e6, description="the bound of rho (verl's rollout_is_threshold)")


class SyncProbeSpec(_Strict):
    """After each weight sync, the sampler and the learner score a fixed probe (docs/monitoring.md, "Sync probe")."""

    enabled: bool = True
    prompts: int = Field(2, ge=1, le=64, description="probe prompts, the job's first training prompts")
    tokens: int = Field(16, ge=1, le=1024, description="continuation tokens scored per prompt")
    tolerance: float | None = Field(
        None, gt=0, le=100, description="largest |log-prob difference| accepted; None: the engine's and dtype's"
    )


class RolloutSpec(_Strict):
    strategy: Literal["sync", "off_policy_async"] = "sync"
    age_tolerance: int = Field(
        0, ge=0, le=MAX_AGE_TOLERANCE, description="max policy age (updates) of a consumed rollout"
    )
    importance_weight_cap: float = Field(
        2.0, gt=1, le=1e9, description="dual-clip bound c: with a negative advantage a ratio counts at most c"
    )
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    learner_sharding: Literal["none", "fsdp"] = Field(
        "none", description="fsdp: the replicas learners shard one policy (FSDP2); none: each holds a copy"
    )
    learner_offload: Literal["none", "cpu"] = Field(
        "none",
        description="cpu: a sharded learner keeps its parameter, gradient and AdamW shards in host memory "
        "(FSDP2 CPUOffloadPolicy), copying each block to the device for its use (learner_sharding fsdp only)",
    )
    generation_replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    runtime: Literal["local", "ray"] = "local"
    ray_address: OperatorUrl | None = None
    generator_base_url: list[HttpUrl] | None = Field(
        None,
        description="OpenAI-compatible servers (vLLM, openrft serve-model) to sample from: one URL, or a list "
        "(replica i samples from server i mod len)",
    )
    engine: Literal["auto", "local", "server", "vllm"] = Field(
        "auto",
        description="what generates rollouts: local (the learner's model, in-process sampler), server "
        "(generator_base_url), vllm (vLLM's LLM engine in the learner's process); auto: server when "
        "generator_base_url is set, else local",
    )
    correction: RolloutCorrectionSpec = RolloutCorrectionSpec()
    sync_probe: SyncProbeSpec = SyncProbeSpec()
    agent: AgentSpec | None = Field(
        None, description="the user's own agent drives each trajectory through OpenRFT's agent routes (docs/agents.md)"
    )

    @field_validator("generator_base_url", mode="before")
    @classmethod
    def _url_list(cls, value: Any) -> Any:
        """One URL is a list of one; an empty list is none."""
        if isinstance(value, str):
            return [value]
        return value or None

    @property
    def generation_engine(self) -> Literal["local", "server", "vllm"]:
        """The engine ``auto`` resolves to."""
        if self.engine != "auto":
            return self.engine
        return "server" if self.generator_base_url else "local"

    @property
    def correction_mode(self) -> Literal["off", "tis", "mis"]:
        """The correction ``auto`` resolves to: tis against an engine, off for the learner's own model."""
        if self.correction.mode != "auto":
            return self.correction.mode
        return "off" if self.generation_engine == "local" else "tis"

    @model_validator(mode="after")
    def _check_engine(self) -> RolloutSpec:
        if self.learner_offload != "none" and self.learner_sharding != "fsdp":
            raise ValueError(
                f"rollout.learner_offload {self.learner_offload!r} needs rollout.learner_sharding 'fsdp' (it is "
                f"{self.learner_sharding!r}): only a sharded learner offloads its shards"
            )
        if self.engine == "server" and not self.generator_base_url:
            raise ValueError("rollout.engine 'server' needs rollout.generator_base_url (the server URLs)")
        if self.engine in ("local", "vllm") and self.generator_base_url:
            urls = ", ".join(map(repr, self.generator_base_url))
            raise ValueError(
                f"rollout.generator_base_url ({urls}) is set but rollout.engine is {self.engine!r}, which does not "
                "use it: set rollout.engine to 'server' (or 'auto'), or unset the URL"
            )
        if self.engine == "vllm" and self.runtime != "local":
            raise ValueError(
                f"rollout.engine 'vllm' (colocated in the learner's process) runs on rollout.runtime 'local', "
                f"not {self.runtime!r}: serve vLLM and set rollout.generator_base_url instead"
            )
        if self.engine == "vllm" and self.learner_sharding != "none":
            raise ValueError(
                f"rollout.engine 'vllm' (colocated in the learner's process) needs one learner holding the whole "
                f"policy, not rollout.learner_sharding {self.learner_sharding!r}: serve vLLM and set "
                "rollout.generator_base_url instead"
            )
        return self


class OptimizerSpec(_Strict):
    lr: float = Field(1e-5, gt=0, le=MAX_LEARNING_RATE)
    weight_decay: float = Field(0.0, ge=0, le=1)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)
    adam_eps: float = Field(1e-8, gt=0, le=1)
    max_grad_norm: float = Field(1.0, ge=0, le=1e6, description="0 = no clipping")
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)


class LoraSpec(_Strict):
    enabled: bool = True
    rank: int = Field(16, ge=1, le=MAX_LORA_RANK)
    alpha: float = Field(32.0, gt=0, le=1e4)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    lora_plus_lr_ratio: float = Field(16.0, ge=0, le=100, description="0 = LoRA+ off (one learning rate)")


class DataFilterSpec(_Strict):
    """Degenerate samples (a run of repeated n-grams) left out of the update (Nova MTRL's ``data_filter``)."""

    max_filter_rate: float = Field(0.5, ge=0, le=1, description="at most this share of a step's samples filtered")
    max_repeated_tokens: int = Field(30, ge=1, description="a sample repeating more tokens than this is degenerate")
    max_ngram_size: int = Field(30, ge=1, le=1024, description="longest repeated n-gram looked for")


class AlgorithmSpec(_Strict):
    """The GRPO-family objective (docs/contracts.md §4)."""

    clip_ratio_low: float = Field(0.2, ge=0, le=1)
    clip_ratio_high: float = Field(0.2, ge=0, le=10)
    kl_loss_coef: float = Field(0.0, ge=0, le=1e3)
    ent_coeff: float = Field(0.0, ge=0, le=1e3)
    loss_scale: float = Field(1.0, gt=0, le=1e6, description="factor of the policy loss only (not KL, not entropy)")
    refit_freq: int = Field(0, ge=0, le=MAX_STEPS, description="reference policy refreshed every N steps; 0 = never")
    ppo_mini_batches: int = Field(
        1,
        ge=1,
        le=MAX_PPO_MINI_BATCHES,
        description="optimizer updates per step, each on a share of the step's groups (verl, TRL)",
    )
    scale_advantages_by_std: bool = Field(True, description="False = Dr. GRPO")
    advantage_eps: float = Field(1e-6, gt=0, le=1)
    data_filter: DataFilterSpec | None = Field(
        None, description="degenerate samples left out of the update (Nova MTRL's data_filter); None = off"
    )
    loss_fn: str = Field(
        "grpo", description="the policy loss by name (algo/losses.py; docs/algorithm.md, 'Losses by name')"
    )
    loss_fn_config: dict[str, float] = Field(
        default_factory=dict, description="the loss's settings over its defaults (not for grpo: see clip_ratio_*)"
    )

    @field_validator("loss_fn")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        from openrft.algo import losses  # the registry (torch), only for a job that names another loss

        if name != losses.DEFAULT_LOSS:
            losses.get(name, where="loss", jobs=True)
        return name

    @field_validator("loss_fn_config")
    @classmethod
    def _loss_settings(cls, config: dict[str, float], info) -> dict[str, float]:
        name = info.data.get("loss_fn")
        if name is None or not config:
            return config
        if name == "grpo":
            raise ValueError(
                "grpo takes no loss_fn_config: its settings are algorithm.clip_ratio_low, clip_ratio_high and "
                "rollout.importance_weight_cap (the dual clip)"
            )
        from openrft.algo import losses

        try:
            losses.resolve_config(name, config, where="loss_fn_config", jobs=True)
        except losses.LossConfigError as exc:
            raise ValueError(str(exc)) from None
        return config


class TrainingSpec(_Strict):
    prompts_per_step: int = Field(ge=1, le=MAX_STEPS)
    total_steps: int = Field(ge=1, le=MAX_STEPS)
    epochs: float | None = Field(None, gt=0, description="informational: what total_steps was derived from")
    micro_batch_tokens: int = Field(
        8192, ge=1, le=MAX_MICRO_BATCH_TOKENS, description="padded tokens per forward/backward pass"
    )
    activation_checkpointing: bool = Field(False, description="recompute each decoder layer in backward")
    seed: int = Field(0, ge=0, le=MAX_SEED)


class EvalSpec(_Strict):
    interval: int = Field(
        0, ge=0, le=MAX_STEPS, description="evaluate every N steps; 0 = only before and after training"
    )
    at_start: bool = True
    samples_per_prompt: int = Field(1, ge=1, le=MAX_SAMPLES_PER_PROMPT)
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, description="None = the rollout temperature")
    max_examples: int | None = Field(None, ge=1, le=MAX_EXAMPLES)
    pass_k: list[int] = Field(
        default_factory=list,
        description="val-score/pass@k for each k (unbiased, over each prompt's samples; k <= samples_per_prompt)",
    )
    success_threshold: float = Field(1.0, description="a validation sample succeeds at a score >= this (pass@k)")

    @field_validator("pass_k")
    @classmethod
    def _positive_k(cls, values: list[int]) -> list[int]:
        bad = [k for k in values if k < 1]
        if bad:
            raise ValueError(f"{bad[0]} is not a k of pass@k: each k is at least 1")
        return sorted(set(values))


class CheckpointSpec(_Strict):
    interval: int = Field(0, ge=0, le=MAX_STEPS, description="checkpoint every N steps; 0 = only at the end")
    keep_top_k: int = Field(3, ge=1, le=1000, description="best checkpoints by validation reward kept")


class TrackingSpec(_Strict):
    tensorboard: bool = True
    sample_prompts_per_step: int = Field(
        2, ge=0, le=MAX_STEPS, description="training prompts per step whose samples are recorded; 0 = none"
    )
    eval_samples: bool = Field(True, description="record every validation sample at each evaluation")
    samples_max_mb: float = Field(
        256.0, gt=0, le=1e6, description="the run's recorded samples are kept under this size, oldest dropped first"
    )
    mlflow_tracking_uri: OutboundUrl | None = None
    mlflow_experiment_name: str | None = None
    mlflow_run_name: str | None = None


class RuntimeSpec(_Strict):
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    threads: int | None = Field(
        None, ge=1, le=MAX_THREADS, description="torch intra-op threads; None = one per physical core"
    )
    processes: int | None = Field(
        None,
        ge=1,
        le=MAX_THREADS,
        description="learner processes on this machine (local runtime, synchronous rollouts): each holds the "
        "policy, samples a share of a batch's prompts and learns a share of its samples; None = the engine's choice "
        "when threads is unset (docs/performance.md, 'Every core')",
    )
    priority: int = Field(
        0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="the job service's order among this tenant's queued jobs, higher first (never ahead of another "
        "tenant's fair share); openrft train ignores it",
    )


class JobSpec(_Strict):
    name: str = "openrft-job"
    dialect: Literal["nova", "vertex", "openai", "canonical"] = "canonical"
    model: ModelSpec
    data: DataSpec
    sampling: SamplingSpec = SamplingSpec()
    rollout: RolloutSpec = RolloutSpec()
    training: TrainingSpec
    optimizer: OptimizerSpec = OptimizerSpec()
    lora: LoraSpec = LoraSpec()
    algorithm: AlgorithmSpec = AlgorithmSpec()
    evaluation: EvalSpec = EvalSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    reward: RewardSpec
    tools: ToolsSpec | None = Field(None, description="multi-turn rollouts with tools (docs/tools.md)")
    tracking: TrackingSpec = TrackingSpec()
    runtime: RuntimeSpec = RuntimeSpec()
    output_dir: Location | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def samples_per_step(self) -> int:
        return self.training.prompts_per_step * self.sampling.samples_per_prompt

    @model_validator(mode="after")
    def _check_consistency(self) -> JobSpec:
        if self.rollout.strategy == "sync" and self.rollout.age_tolerance != 0:
            raise ValueError("rollout.age_tolerance must be 0 when rollout.strategy is 'sync'")
        if self.algorithm.ppo_mini_batches > self.training.prompts_per_step:
            raise ValueError(
                f"algorithm.ppo_mini_batches ({self.algorithm.ppo_mini_batches}) is more than the prompts of a "
                f"step ({self.training.prompts_per_step}): each mini-batch holds at least one whole group"
            )
        if self.rollout.agent is not None and self.tools is not None:
            raise ValueError(
                "rollout.agent and tools are both set: with your own agent, the agent runs its tools itself "
                "(unset tools), or let OpenRFT run the tools (unset rollout.agent)"
            )
        return self
