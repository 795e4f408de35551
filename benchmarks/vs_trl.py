"""OpenRFT against TRL's GRPOTrainer on the demo job, one after the other in one process.

Both train the demo model on the demo data with the demo recipe's settings (``trl_match.MAPPING``),
for the same number of steps, with the same torch threads, and are evaluated at the same steps by
the same code (``openrft.engine.evaluation.evaluate``: the validation prompts, one sample each at
the rollout temperature, a fixed seed). Seeds alternate which system runs first, so slow drifts of
the shared machine's load fall on both.

Step time (the figure compared) is the work of one step: sample prompts, generate, score,
advantages, forward/backward, optimizer step. OpenRFT: from the job asking its control whether to
go on to the step's metrics being emitted; TRL: from ``on_step_begin`` to ``on_step_end`` (its
generation, scoring and loss run inside the step, the optimizer step just before
``on_step_end``); evaluation is left out of both. Each is measured in wall seconds and in the
process's CPU seconds, which the load of other processes hardly changes. The wall interval between
consecutive steps (logging included, evaluation excluded) is reported beside them.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from benchmarks.common import load_average, median_after_warmup, pinned_cores, spread
from benchmarks.trl_match import grpo_config_kwargs
from openrft.engine import JobControl, RFTJob
from openrft.engine.evaluation import EvalResult, evaluate
from openrft.engine.job import EVAL_SEED_OFFSET
from openrft.engine.phase_threads import PhaseThreads
from openrft.runtime import runtime_for
from openrft.spec.dialects import load_job
from openrft.spec.job import JobSpec

RECIPE = Path(__file__).resolve().parent.parent / "examples" / "arithmetic" / "recipe.yaml"


@dataclass
class RunResult:
    system: str
    seed: int
    step_times: list[float] = field(default_factory=list)  # the work of each step, wall seconds
    step_cpu: list[float] = field(default_factory=list)  # the same, CPU seconds of the process (load-robust)
    intervals: list[float] = field(default_factory=list)  # wall time between steps, evaluation excluded
    val_reward: dict[int, float] = field(default_factory=dict)  # step -> mean validation reward
    train_reward: list[float] = field(default_factory=list)  # mean rollout reward of each step
    eval_seconds: float = 0.0
    wall_seconds: float = 0.0
    threads: int = 0
    chosen_threads: dict[str, list[int]] = field(default_factory=dict)  # OpenRFT's per-phase [processes, threads]

    def summary(self, warmup: int) -> dict:
        return {
            "system": self.system,
            "seed": self.seed,
            "median_step_s": median_after_warmup(self.step_times, warmup),
            "median_step_cpu_s": median_after_warmup(self.step_cpu, warmup),
            "median_interval_s": median_after_warmup(self.intervals, warmup),
            "final_val_reward": self.val_reward[max(self.val_reward)],
            "val_reward": {str(k): v for k, v in sorted(self.val_reward.items())},
            "step_times": self.step_times,
            "step_cpu": self.step_cpu,
            "intervals": self.intervals,
            "train_reward": self.train_reward,
            "eval_seconds": self.eval_seconds,
            "wall_seconds": self.wall_seconds,
            "chosen_threads": self.chosen_threads,
        }


def matched_spec(
    steps: int, seed: int, eval_every: int, threads: int | None, lr: float | None = None, recipe: Path = RECIPE
) -> JobSpec:
    """The demo recipe as both systems run it: no checkpoints until the end, no TensorBoard, the
    reference never refitted (TRL cannot refresh a PEFT reference)."""
    spec = load_job(recipe)
    spec.training.total_steps = steps
    spec.training.seed = seed
    spec.algorithm.refit_freq = 0
    spec.evaluation.interval = eval_every
    spec.evaluation.at_start = True
    spec.checkpoint.interval = 0
    spec.checkpoint.keep_top_k = 1
    spec.tracking.tensorboard = False
    spec.runtime.threads = threads
    if lr is not None:
        spec.optimizer.lr = lr
    return spec


def clock() -> tuple[float, float]:
    """Wall seconds and the process's CPU seconds (all its threads): CPU time hardly changes with the load
    of other processes, so the CPU-time ratio checks the wall-time one."""
    return time.perf_counter(), time.process_time()


class _StepClock(JobControl):
    """Notes when each step starts (the job asks its control before every step)."""

    def __init__(self):
        self.started: dict[int, tuple[float, float]] = {}

    def poll(self, step: int) -> str:
        self.started[step] = clock()
        return "continue"


class _TimedJob(RFTJob):
    """An RFTJob that records how long its evaluations take (they are excluded from step times), and with
    ``most_threads`` set chooses its threads per phase among counts up to it: what ``runtime.threads`` unset gives
    on an idle machine of that many cores, without the start-up load average capping the count."""

    eval_time: dict[int, tuple[float, float]]
    most_threads: int | None = None

    def _build(self) -> None:
        super()._build()
        if self.most_threads:
            self.threads = PhaseThreads(self.most_threads)

    def _evaluate(self, step: int) -> EvalResult:
        wall, cpu = clock()
        result = super()._evaluate(step)
        end_wall, end_cpu = clock()
        self.eval_time[step] = (end_wall - wall, end_cpu - cpu)
        return result


def run_openrft(
    spec: JobSpec, workdir: Path, most_threads: int | None = None, learners: int = 1, choose: bool = False
) -> RunResult:
    """The engine's own job loop. A step runs from the job asking its control whether to go on to the
    metrics of the step being emitted (rollout, reward, advantages, update, metrics), evaluation left out.
    ``most_threads``: the engine chooses per phase among counts up to it (``_TimedJob``). ``learners`` > 1:
    that many data-parallel learners on a Ray instance of this machine, one thread each, each sampling and
    learning on its share of the batch (the process's CPU seconds are then only the driver's). ``choose``: OpenRFT
    left to choose (``runtime.threads`` unset), on the cores this process may use."""
    result = RunResult("OpenRFT", spec.training.seed)
    if choose:
        spec.runtime.threads = None
    if learners > 1:
        spec.rollout.runtime, spec.rollout.replicas, spec.runtime.threads = "ray", learners, 1
    runtime = runtime_for(spec)  # the composition root, as every job's
    ended: dict[int, tuple[float, float]] = {}
    rows: dict[int, dict] = {}

    def listener(step: int, metrics: dict[str, float]) -> None:
        ended[step] = clock()
        rows[step] = metrics

    run_dir = workdir / f"openrft-{spec.training.seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    control = _StepClock()
    job = _TimedJob(spec, run_dir, show_progress=False, control=control, listeners=(listener,), runtime=runtime)
    job.eval_time = {}
    job.most_threads = most_threads
    start = time.perf_counter()
    job.run()
    result.wall_seconds = time.perf_counter() - start
    for step in sorted(rows):
        metrics = rows[step]
        if "val-score/rewards/mean@1" in metrics:
            result.val_reward[step] = metrics["val-score/rewards/mean@1"]
        if step == 0:
            continue
        eval_wall, eval_cpu = job.eval_time.get(step, (0.0, 0.0))
        result.step_times.append(ended[step][0] - control.started[step][0] - eval_wall)
        result.step_cpu.append(ended[step][1] - control.started[step][1] - eval_cpu)
        result.train_reward.append(metrics.get("critic/rewards/mean", float("nan")))
        if step - 1 in ended:
            result.intervals.append(ended[step][0] - ended[step - 1][0] - eval_wall)
    result.eval_seconds = sum(wall for wall, _ in job.eval_time.values())
    result.threads = torch.get_num_threads()
    result.chosen_threads = {name: list(p.chosen) for name, p in job.threads.phases.items() if p.chosen is not None}
    return result


def lora_plus_grpo_trainer(spec: JobSpec):
    """TRL's GRPOTrainer training with OpenRFT's own AdamW groups (LoRA+: TRL has no option for it)."""
    from trl import GRPOTrainer

    from openrft.learner.optimizer import build_optimizer

    class LoraPlusGRPOTrainer(GRPOTrainer):
        def create_optimizer(self, model=None):
            if self.optimizer is None:
                self.optimizer = build_optimizer(model or self.model, spec.optimizer, spec.lora)
            return self.optimizer

    return LoraPlusGRPOTrainer


def run_trl(spec: JobSpec, workdir: Path) -> RunResult:
    """TRL's GRPOTrainer on the same model, data, reward and settings (see ``trl_match``)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig

    from openrft.engine.setup import build_parts
    from openrft.learner.policy import lora_config
    from openrft.models import configure_threads
    from openrft.rewards.runner import RewardRunner
    from openrft.rewards.types import RewardSample
    from openrft.rollout.local import TransformersGenerator
    from openrft.rollout.types import SamplingParams

    seed = spec.training.seed
    result = RunResult("TRL GRPOTrainer", seed)
    parts = build_parts(spec)  # the same model, tokenizer, datasets, prompts, reward and threads as OpenRFT
    configure_threads(spec.runtime.threads)
    rewards = RewardRunner(parts.reward)
    train = parts.datasets.train
    dataset = Dataset.from_list([{"prompt": ex.messages, "index": i} for i, ex in enumerate(train)])
    eval_params = SamplingParams(
        n=spec.evaluation.samples_per_prompt,
        temperature=spec.sampling.temperature,
        top_k=spec.sampling.top_k,
        top_p=spec.sampling.top_p,
        max_new_tokens=parts.max_new_tokens,
    )
    step_rewards: list[float] = []

    def exact_match(prompts, completions, index, **kwargs) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        samples = [RewardSample(train[i], text, sample_index=j) for j, (i, text) in enumerate(zip(index, texts))]
        scores = [o.score if o.ok else None for o in rewards.score(samples)]
        step_rewards.append(statistics.fmean(s for s in scores if s is not None))
        return scores

    LoraPlusGRPOTrainer = lora_plus_grpo_trainer(spec)

    class Timing(TrainerCallback):
        def __init__(self):
            self.begin = (0.0, 0.0)
            self.last_end = 0.0

        def _evaluate(self, model, step: int) -> None:
            start = time.perf_counter()
            generator = TransformersGenerator(model, parts.tokenizer, parts.eos_ids, parts.tokenizer.pad_token_id)
            outcome = evaluate(
                generator,
                rewards,
                parts.datasets.validation,
                parts.val_prompts,
                eval_params,
                seed + EVAL_SEED_OFFSET,
                step,
            )
            result.val_reward[step] = outcome.mean_reward
            result.eval_seconds += time.perf_counter() - start

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._evaluate(model, 0)
            self.last_end = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = clock()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            now, cpu = clock()
            result.step_times.append(now - self.begin[0])
            result.step_cpu.append(cpu - self.begin[1])
            result.intervals.append(now - self.last_end)
            result.train_reward.append(step_rewards[-1] if step_rewards else float("nan"))
            step = state.global_step
            if (spec.evaluation.interval and step % spec.evaluation.interval == 0) or step == spec.training.total_steps:
                self._evaluate(model, step)
            self.last_end = time.perf_counter()

    config = GRPOConfig(
        **grpo_config_kwargs(spec, parts.max_new_tokens, spec.training.total_steps, str(workdir / f"trl-{seed}"), seed)
    )
    torch.manual_seed(seed)
    trainer = LoraPlusGRPOTrainer(
        model=parts.model,
        reward_funcs=[exact_match],
        args=config,
        train_dataset=dataset,
        processing_class=parts.tokenizer,
        peft_config=lora_config(spec.lora),
        callbacks=[Timing()],
    )
    for noisy in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(noisy)
    start = time.perf_counter()
    try:
        trainer.train()
    finally:
        rewards.close()
    result.wall_seconds = time.perf_counter() - start
    result.threads = torch.get_num_threads()
    return result


def compare(
    steps: int,
    seeds: list[int],
    eval_every: int,
    threads: int | None,
    warmup: int,
    workdir: Path | None = None,
    lr: float | None = None,
    log=print,
    engine_threads: bool = False,
    learners: int = 1,
    choose: bool = False,
) -> dict:
    """Both systems for each seed, alternating which goes first; per-seed and aggregate numbers. With
    ``engine_threads`` OpenRFT chooses per phase among counts up to ``threads``, with ``learners`` > 1 it runs
    that many data-parallel learners of one thread each, with ``choose`` it is left to choose (threads and learner
    processes) on ``threads`` cores (the process pinned to them); TRL runs at ``threads``."""
    own_dir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="openrft-vs-trl-")) if own_dir else workdir
    load = {"before": load_average()}
    openrft = partial(run_openrft, most_threads=threads if engine_threads else None, learners=learners, choose=choose)
    runs: list[RunResult] = []
    pinned = pinned_cores(threads) if choose and threads else contextlib.nullcontext()
    try:
        with pinned:
            for k, seed in enumerate(seeds):
                order = (openrft, run_trl) if k % 2 == 0 else (run_trl, openrft)
                for runner in order:
                    run = runner(matched_spec(steps, seed, eval_every, threads, lr), workdir)
                    runs.append(run)
                    s = run.summary(warmup)
                    chosen = f", layouts kept {run.chosen_threads}" if run.chosen_threads else ""
                    log(
                        f"  {run.system:16s} seed {seed}: median step {s['median_step_s']:.3f} s, interval "
                        f"{s['median_interval_s']:.3f} s, val reward {s['val_reward']}{chosen}  (load {load_average()})"
                    )
    finally:
        if own_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    load["after"] = load_average()
    # TRL's: it always runs at ``threads``; OpenRFT may choose its own or run in learner processes
    threads_used = next((r.threads for r in runs if r.system != "OpenRFT"), torch.get_num_threads())
    return summarise(runs, warmup) | {
        "load": load,
        "steps": steps,
        "seeds": seeds,
        "eval_every": eval_every,
        "warmup_steps_excluded": warmup,
        "threads": threads_used,
    }


def summarise(runs: list[RunResult], warmup: int) -> dict:
    per_run = [r.summary(warmup) for r in runs]
    ours = [s for s in per_run if s["system"] == "OpenRFT"]
    theirs = [s for s in per_run if s["system"] != "OpenRFT"]
    ratios = [t["median_step_s"] / o["median_step_s"] for o, t in zip(ours, theirs)]
    interval_ratios = [t["median_interval_s"] / o["median_interval_s"] for o, t in zip(ours, theirs)]
    cpu_ratios = [t["median_step_cpu_s"] / o["median_step_cpu_s"] for o, t in zip(ours, theirs)]
    steps = sorted({int(k) for s in per_run for k in s["val_reward"]})

    def curve(rows: list[dict]) -> list[dict]:
        return [
            {"step": st, **spread([r["val_reward"][str(st)] for r in rows if str(st) in r["val_reward"]])}
            for st in steps
        ]

    return {
        "runs": per_run,
        "speedup_per_seed": ratios,
        "speedup_median": statistics.median(ratios),
        "interval_speedup_per_seed": interval_ratios,
        "cpu_speedup_per_seed": cpu_ratios,
        "cpu_speedup_median": statistics.median(cpu_ratios),
        "openrft_median_step_s": statistics.median(s["median_step_s"] for s in ours),
        "trl_median_step_s": statistics.median(s["median_step_s"] for s in theirs),
        "openrft_final_val": spread([s["final_val_reward"] for s in ours]),
        "trl_final_val": spread([s["final_val_reward"] for s in theirs]),
        "openrft_curve": curve(ours),
        "trl_curve": curve(theirs),
    }


def verdict(summary: dict) -> str:
    """Whether OpenRFT's final validation reward is lower than TRL's beyond run-to-run noise: more than two
    standard errors of the difference of the seed means (each side's std over seeds)."""
    ours, theirs = summary["openrft_final_val"], summary["trl_final_val"]
    n = len(summary["speedup_per_seed"])
    difference = ours["mean"] - theirs["mean"]
    if n < 2:
        return f"Difference {difference:+.3f} (one seed: no noise estimate)."
    noise = math.sqrt(ours["std"] ** 2 / n + theirs["std"] ** 2 / n)
    lower = difference < -2 * noise
    return (
        f"Difference {difference:+.3f}; standard error of the difference {noise:.3f} (std over {n} seeds of each): "
        + ("OpenRFT is lower beyond noise." if lower else "not lower beyond run-to-run noise.")
    )
