"""The demo recipe translated into TRL's GRPOConfig: every training setting mapped, and documented."""

import trl

from benchmarks.trl_match import MAPPING, grpo_config_kwargs
from benchmarks.vs_trl import matched_spec

BOOKKEEPING = {
    "output_dir",
    "max_steps",
    "logging_steps",
    "save_strategy",
    "report_to",
    "use_cpu",
    "dataloader_num_workers",
    "disable_tqdm",
}


def _kwargs(**changes):
    spec = matched_spec(steps=7, seed=3, eval_every=5, threads=1)
    for path, value in changes.items():
        section, field = path.split(".")
        setattr(getattr(spec, section), field, value)
    return spec, grpo_config_kwargs(spec, max_new_tokens=6, steps=7, output_dir="/tmp/x", seed=3)


def test_demo_recipe_maps_to_grpo_config():
    spec, kw = _kwargs()
    assert spec.algorithm.refit_freq == 0  # TRL cannot refresh a PEFT reference
    assert kw["per_device_train_batch_size"] == 256 and kw["gradient_accumulation_steps"] == 1
    assert kw["num_generations"] == 8 and kw["max_completion_length"] == 6
    assert (kw["temperature"], kw["top_k"], kw["top_p"]) == (1.0, 0, 1.0)
    assert kw["learning_rate"] == 2e-4 and (kw["adam_beta1"], kw["adam_beta2"]) == (0.9, 0.95)
    assert kw["lr_scheduler_type"] == "constant" and kw["warmup_steps"] == 0 and kw["max_grad_norm"] == 1.0
    assert kw["beta"] == 0.001 and kw["use_bias_correction_kl"] is False
    assert (kw["epsilon"], kw["epsilon_high"]) == (0.2, 0.28)
    assert kw["loss_type"] == "dapo" and kw["scale_rewards"] == "group" and kw["num_iterations"] == 1
    assert kw["bf16"] is False and kw["gradient_checkpointing"] is False
    assert kw["seed"] == 3 and kw["max_steps"] == 7


def test_mapping_follows_the_spec():
    _, kw = _kwargs(
        **{
            "algorithm.scale_advantages_by_std": False,
            "algorithm.kl_loss_coef": 0.05,
            "sampling.samples_per_prompt": 4,
            "training.prompts_per_step": 16,
        }
    )
    assert kw["scale_rewards"] == "none" and kw["beta"] == 0.05
    assert kw["num_generations"] == 4 and kw["per_device_train_batch_size"] == 64


def test_every_training_argument_is_documented():
    _, kw = _kwargs()
    documented = " ".join(m.trl for m in MAPPING)
    missing = [k for k in kw if k not in BOOKKEEPING and k not in documented]
    assert not missing, f"GRPOConfig arguments without a line in MAPPING: {missing}"


def test_kwargs_build_a_grpo_config():
    _, kw = _kwargs()
    config = trl.GRPOConfig(**kw)
    assert config.generation_batch_size == 256 and config.steps_per_generation == 1
    assert config.epsilon_high == 0.28 and config.scale_rewards == "group"
