"""Asynchronous against synchronous rollouts with a slow reward, side by side on the demo job.

    python -m benchmarks.async_rollouts [--steps 30] [--lr RATE] [--delay 1.0] [--tolerance 2] [--replicas 2]

The reward is the example Nova reward server on 127.0.0.1 answering each call after ``delay``
seconds (every batch of samples is one call). The synchronous loop waits for it at every step; the
asynchronous loop (``off_policy_async``, ``age_tolerance``, ``generation_replicas`` threads) keeps
generating and scoring ahead while the learner trains. Both runs train the demo recipe
(``examples/arithmetic/recipe.yaml``) for the same number of steps from the same seed and evaluate
every few steps on the same validation prompts. Writes ``benchmarks/results/async_rollouts.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openrft.engine import RFTJob
from openrft.engine.metrics import read_metrics
from openrft.runtime import runtime_for
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "reward_server" / "server.py"
RECIPE = ROOT / "examples" / "arithmetic" / "recipe.yaml"
RESULTS = ROOT / "benchmarks" / "results"


VAL = "val-score/rewards/mean@{}"


def run_job(url: str, args: argparse.Namespace, strategy: str, run_dir: Path) -> dict:
    spec = load_job(RECIPE)
    spec.reward = RewardSpec.model_validate(
        {"function": {"type": "nova_lambda", "endpoint": url, "batch_size": 4096, "concurrency_limit": 8}}
    )
    spec.training.total_steps = args.steps
    spec.evaluation.interval = args.eval_every
    spec.evaluation.max_examples = args.eval_examples
    spec.evaluation.samples_per_prompt = args.eval_samples
    spec.checkpoint.interval = 0
    spec.tracking.tensorboard = False
    spec.runtime.threads = args.threads
    if args.lr is not None:
        spec.optimizer.lr = args.lr
    if strategy == "async":
        spec.rollout.strategy, spec.rollout.age_tolerance = "off_policy_async", args.tolerance
        spec.rollout.generation_replicas = args.replicas
    started = time.perf_counter()
    summary = RFTJob(spec, run_dir, show_progress=False, runtime=runtime_for(spec)).run()
    wall = time.perf_counter() - started
    rows = read_metrics(run_dir / "metrics.jsonl")
    val = VAL.format(args.eval_samples)
    steps = [r for r in rows if r["step"] > 0]
    return {
        "strategy": strategy,
        "status": summary["status"],
        "steps": summary["steps"],
        "wall_seconds": wall,
        "training_seconds": sum(r["perf/time_per_step"] for r in steps),
        "train_reward": [r.get("critic/rewards/mean") for r in steps],
        "val_reward": {r["step"]: r[val] for r in rows if val in r},
        "policy_age_mean": [r.get("rollout/policy_age/mean", 0.0) for r in steps],
        "dropped_total": steps[-1].get("rollout/dropped_total", 0.0),
        "mismatch_kl_mean": _mean([r["rollout/mismatch_kl"] for r in steps if "rollout/mismatch_kl" in r]),
    }


def recipe_shape(lr: float | None) -> str:
    spec = load_job(RECIPE)
    rate = f"learning rate {spec.optimizer.lr if lr is None else lr:g}"
    return f"{spec.training.prompts_per_step} prompts x {spec.sampling.samples_per_prompt} samples per step, {rate}"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--delay", type=float, default=1.0, help="reward server seconds per call")
    parser.add_argument("--tolerance", type=int, default=2, help="age_tolerance of the asynchronous run")
    parser.add_argument("--replicas", type=int, default=2, help="generation replicas of the asynchronous run")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=None, help="learning rate of both runs (default: the recipe's)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads of both runs (1: no OpenMP spin-waiting on a shared CPU)",
    )
    parser.add_argument("--eval-examples", type=int, default=128)
    parser.add_argument("--eval-samples", type=int, default=4, help="validation samples per prompt (less noise)")
    args = parser.parse_args(argv)
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--delay", str(args.delay)], stdout=subprocess.PIPE, text=True
    )
    try:
        url = re.search(r"(http://\S+/)", server.stdout.readline()).group(1)  # type: ignore[union-attr]
        runs = {}
        with tempfile.TemporaryDirectory() as tmp:
            for strategy in ("sync", "async"):
                runs[strategy] = run_job(url, args, strategy, Path(tmp) / strategy)
                print(
                    f"{strategy:5s} {runs[strategy]['wall_seconds']:7.1f} s wall, "
                    f"{runs[strategy]['training_seconds']:7.1f} s in steps, val {runs[strategy]['val_reward']}",
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait(timeout=10)
    sync, async_ = runs["sync"], runs["async"]
    result = {
        "command": "python -m benchmarks.async_rollouts " + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps": args.steps,
        "reward_delay_s": args.delay,
        "age_tolerance": args.tolerance,
        "generation_replicas": args.replicas,
        "threads": args.threads,
        "lr": args.lr,
        "recipe": recipe_shape(args.lr),
        "eval_samples": args.eval_samples,
        "eval_examples": args.eval_examples,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "wall_ratio_sync_over_async": sync["wall_seconds"] / async_["wall_seconds"],
        "step_time_ratio_sync_over_async": sync["training_seconds"] / async_["training_seconds"],
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "async_rollouts.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "async_rollouts.md").write_text(report(result))
    print(f"wall time sync / async = {result['wall_ratio_sync_over_async']:.2f}; wrote {RESULTS / 'async_rollouts.md'}")


def report(result: dict) -> str:
    sync, async_ = result["runs"]["sync"], result["runs"]["async"]
    lines = [
        f"# Asynchronous vs synchronous rollouts ({result['steps']} steps, reward {result['reward_delay_s']:g} s "
        "per call)",
        "",
        f"Demo recipe ({result['recipe']}), example Nova reward server on 127.0.0.1 answering each call "
        f"after {result['reward_delay_s']:g} s. Asynchronous: `off_policy_async`, age_tolerance "
        f"{result['age_tolerance']}, {result['generation_replicas']} generation replicas (threads). "
        f"Machine: {result['machine']}. Command: `{result['command'].strip()}`.",
        "",
        "| loop | wall s | s in steps | s per step | dropped | mean policy age | mismatch KL | final val reward |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in (sync, async_):
        ages = run["policy_age_mean"]
        kl = run["mismatch_kl_mean"]
        final_val = run["val_reward"][max(run["val_reward"], key=int)]
        lines.append(
            f"| {run['strategy']} | {run['wall_seconds']:.1f} | {run['training_seconds']:.1f} | "
            f"{run['training_seconds'] / run['steps']:.2f} | {run['dropped_total']:.0f} | "
            f"{sum(ages) / len(ages):.2f} | {'-' if kl is None else f'{kl:.2e}'} | {final_val:.3f} |"
        )
    lines += [
        "",
        f"**Wall time ratio sync / async: {result['wall_ratio_sync_over_async']:.2f}x** "
        f"(time in steps: {result['step_time_ratio_sync_over_async']:.2f}x).",
        "",
        f"Validation reward (mean@{result['eval_samples']} over {result['eval_examples']} prompts, the same "
        "sampling seed) by step:",
        "",
        "| step | " + " | ".join(str(s) for s in sorted(sync["val_reward"], key=int)) + " |",
        "| --- | " + " | ".join("---:" for _ in sync["val_reward"]) + " |",
    ]
    for run in (sync, async_):
        lines.append(
            f"| {run['strategy']} | "
            + " | ".join(f"{run['val_reward'][s]:.3f}" for s in sorted(run["val_reward"], key=int))
            + " |"
        )
    lines += [
        "",
        "Training reward (critic/rewards/mean) by step:",
        "",
        "| loop | " + " | ".join(str(i + 1) for i in range(len(sync["train_reward"]))) + " |",
        "| --- | " + " | ".join("---:" for _ in sync["train_reward"]) + " |",
    ]
    for run in (sync, async_):
        lines.append(f"| {run['strategy']} | " + " | ".join(f"{v:.2f}" for v in run["train_reward"]) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
