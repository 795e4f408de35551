"""The OpenRFT job spec translated into TRL ``GRPOConfig`` arguments, field by field.

``MAPPING`` is the documented correspondence (docs/performance.md prints it); ``grpo_config_kwargs``
applies it. Nothing here imports TRL, so the mapping is testable without the benchmark extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from openrft.spec.job import JobSpec


@dataclass(frozen=True)
class Mapped:
    openrft: str  # the JobSpec field (or what OpenRFT does)
    trl: str  # the GRPOConfig / GRPOTrainer argument
    note: str


MAPPING: tuple[Mapped, ...] = (
    Mapped(
        "training.prompts_per_step x sampling.samples_per_prompt",
        "per_device_train_batch_size, gradient_accumulation_steps=1",
        "256 samples per optimizer step (32 prompts x 8); steps_per_generation follows (1): one generation "
        "batch per step, as OpenRFT",
    ),
    Mapped("sampling.samples_per_prompt", "num_generations", "8 completions per prompt"),
    Mapped(
        "sampling.max_new_tokens (max_length caps each prompt + completion)",
        "max_completion_length",
        "6 tokens; the demo's prompts leave room for all 6 within max_length 64",
    ),
    Mapped("sampling.temperature / top_k / top_p", "temperature / top_k / top_p", "1.0 / 0 (off) / 1.0"),
    Mapped(
        "optimizer.lr, adam_beta1/2, adam_eps, weight_decay",
        "learning_rate, adam_beta1, adam_beta2, adam_epsilon, weight_decay",
        "the recipe's 2e-4 (or --lr), 0.9/0.95, 1e-8, 0",
    ),
    Mapped(
        "lora.lora_plus_lr_ratio (LoRA+: B matrices at lr x 4)",
        "create_optimizer override",
        "TRL has no LoRA+ option: the trainer gets OpenRFT's own optimizer builder "
        "(peft.optimizers.create_loraplus_optimizer), so both train with the same AdamW groups",
    ),
    Mapped(
        "optimizer.warmup_steps = 0 (constant rate)",
        "lr_scheduler_type='constant', warmup_steps=0",
        "TRL's default is a linear decay to 0",
    ),
    Mapped("optimizer.max_grad_norm", "max_grad_norm", "1.0"),
    Mapped(
        "lora.rank / alpha / dropout / target_modules",
        "peft_config=LoraConfig(...)",
        "the same LoraConfig object (openrft.learner.policy.lora_config): r=16, alpha=32, all-linear",
    ),
    Mapped("algorithm.kl_loss_coef", "beta", "0.001, k3 estimator in both"),
    Mapped(
        "k3 KL gradient without importance weight",
        "use_bias_correction_kl=False",
        "TRL's default multiplies the KL by the ratio, which changes its gradient",
    ),
    Mapped(
        "reference = initial policy (adapter disabled)",
        "(PEFT: adapter disabled)",
        "the benchmark runs OpenRFT with refit_freq=0: TRL cannot refresh a PEFT reference (sync_ref_model is "
        "refused with PEFT)",
    ),
    Mapped("algorithm.clip_ratio_low / clip_ratio_high", "epsilon / epsilon_high", "0.2 / 0.28"),
    Mapped("token-level loss over the global batch (DAPO)", "loss_type='dapo'", "sum over tokens / tokens in batch"),
    Mapped(
        "algorithm.scale_advantages_by_std=True",
        "scale_rewards='group'",
        "(r - mean) / (std + eps), sample std per group; eps 1e-6 in OpenRFT, 1e-4 in TRL",
    ),
    Mapped(
        "algorithm.ppo_mini_batches (1: one update per batch)",
        "steps_per_generation, num_iterations=1",
        "ratio 1 on the first update, no old log-prob pass in either; later updates against the policy before "
        "the first",
    ),
    Mapped("algorithm.ent_coeff = 0", "entropy_coef=0.0", ""),
    Mapped("model.dtype float32 on CPU", "bf16=False, fp16=False", "TRL defaults to bf16 autocast"),
    Mapped(
        "no activation checkpointing",
        "gradient_checkpointing=False",
        "TRL's default (True) recomputes activations; turned off here, TRL's faster setting",
    ),
    Mapped(
        "reward exact_match", "reward_funcs=[OpenRFT's exact_match]", "the same RewardRunner scores TRL's completions"
    ),
    Mapped("training.seed", "seed", "per run; the data order differs (each its own sampler)"),
    Mapped("data.shuffle", "shuffle_dataset", "a fresh permutation of the prompts every epoch in both"),
    Mapped("runtime.threads", "torch.set_num_threads", "the same intra-op threads for both"),
)


def grpo_config_kwargs(spec: JobSpec, max_new_tokens: int, steps: int, output_dir: str, seed: int) -> dict:
    """Keyword arguments of ``trl.GRPOConfig`` that train what ``spec`` trains (see ``MAPPING``)."""
    s, o, a = spec.sampling, spec.optimizer, spec.algorithm
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": spec.samples_per_step // a.ppo_mini_batches,
        "steps_per_generation": a.ppo_mini_batches,
        "gradient_accumulation_steps": 1,
        "num_generations": s.samples_per_prompt,
        "max_completion_length": max_new_tokens,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "learning_rate": o.lr,
        "adam_beta1": o.adam_beta1,
        "adam_beta2": o.adam_beta2,
        "adam_epsilon": o.adam_eps,
        "weight_decay": o.weight_decay,
        "lr_scheduler_type": "constant",
        "warmup_steps": o.warmup_steps,
        "max_grad_norm": o.max_grad_norm,
        "beta": a.kl_loss_coef,
        "use_bias_correction_kl": False,
        "epsilon": a.clip_ratio_low,
        "epsilon_high": a.clip_ratio_high,
        "loss_type": "dapo",
        "scale_rewards": "group" if a.scale_advantages_by_std else "none",
        "num_iterations": 1,
        "entropy_coef": a.ent_coeff,
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "max_steps": steps,
        "seed": seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
        "shuffle_dataset": spec.data.shuffle,
    }
