"""What recording samples costs: the demo job with samples off and on (the defaults: 2 prompts' samples per
step, every validation sample at each evaluation, TensorBoard text), run alternately in one process so that
both see the same load.

    python -m benchmarks.samples [--rounds 3] [--steps 100]

Writes ``benchmarks/results/samples.{md,json}``: per run, the median ``perf/time_per_step`` (rollout, reward,
update and the training samples' recording) and the job's wall time (with evaluations and their samples), and
the ratios on/off of the medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import load_average, markdown_table, median_after_warmup, write_results
from benchmarks.demo import demo_spec
from openrft.engine import RFTJob
from openrft.engine.metrics import read_metrics
from openrft.engine.samples import read_samples

VARIANTS = ("off", "on")


def run_once(variant: str, steps: int, workdir: Path) -> dict:
    spec = demo_spec(threads=None, total_steps=steps)
    spec.tracking.tensorboard = True  # the demo's own setting: the samples' text goes there too
    if variant == "off":
        spec.tracking.sample_prompts_per_step = 0
        spec.tracking.eval_samples = False
    run_dir = workdir / f"{variant}-{time.monotonic_ns()}"
    started = time.perf_counter()
    summary = RFTJob(spec, run_dir, show_progress=False).run()
    wall = time.perf_counter() - started
    rows = read_metrics(run_dir / "metrics.jsonl")
    step_times = [r["perf/time_per_step"] for r in rows if "perf/time_per_step" in r]
    samples_file = sum(p.stat().st_size for p in run_dir.glob("samples*.jsonl"))
    return {
        "variant": variant,
        "median_step_s": median_after_warmup(step_times, 1),
        "job_wall_s": wall,
        "final_val_reward": summary["final_val_reward"],
        "samples": sum(1 for _ in read_samples(run_dir)),
        "samples_bytes": samples_file,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.samples")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    load_before = load_average()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]  # alternate which goes first
            for variant in order:
                result = run_once(variant, args.steps, Path(tmp))
                result["round"] = round_index
                runs.append(result)
                print(
                    f"round {round_index} samples {variant}: {result['median_step_s']:.3f} s/step, "
                    f"job {result['job_wall_s']:.1f} s, {result['samples']} samples",
                    flush=True,
                )

    def median_of(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["variant"] == variant)

    step_ratio = median_of("on", "median_step_s") / median_of("off", "median_step_s")
    wall_ratio = median_of("on", "job_wall_s") / median_of("off", "job_wall_s")
    same_curve = len({r["final_val_reward"] for r in runs}) == 1
    columns = [
        ("round", "round:"),
        ("variant", "samples"),
        ("median_step_s", "median s/step:"),
        ("job_wall_s", "job wall s:"),
        ("samples", "samples recorded:"),
        ("samples_bytes", "samples bytes:"),
        ("final_val_reward", "final val reward:"),
    ]
    body = [
        f"The demo job (`examples/arithmetic/recipe.yaml`, {args.steps} steps, TensorBoard on), samples off "
        "(`sample_prompts_per_step: 0`, `eval_samples: false`) and on (the defaults: 2 prompts x 8 samples per "
        "step, the 200 validation samples at each of the 11 evaluations), alternately, "
        f"{args.rounds} rounds. The machine was shared with other jobs: compare the ratios, not the seconds.",
        "",
        *markdown_table(columns, runs),
        "",
        f"- median step time, on / off: **{step_ratio:.3f}** (the goal: at most 1.05)",
        f"- job wall time (with evaluations and model loading), on / off: **{wall_ratio:.3f}**",
        f"- the same final validation reward in every run: {same_curve}",
    ]
    data = {
        "runs": runs,
        "step_ratio": step_ratio,
        "wall_ratio": wall_ratio,
        "load": {"before": load_before, "after": load_average()},
    }
    kwargs = {"results_dir": args.out} if args.out else {}
    path = write_results("samples", "Recording samples: the demo job with samples off and on", body, data, **kwargs)
    print(f"step ratio {step_ratio:.3f}, wall ratio {wall_ratio:.3f}; wrote {path}")


if __name__ == "__main__":
    main()
