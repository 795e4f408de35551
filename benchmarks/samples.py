"""What recording samples costs: the demo job with samples off, on (the defaults: 2 prompts' samples per step,
every validation sample at each evaluation, TensorBoard text) and on with the service's job store as well (a
SQLite store, as ``openrft serve`` keeps them), run in turn in one process so that all see the same load.

    python -m benchmarks.samples [--rounds 2] [--steps 100]

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
from openrft.service.store import Store

VARIANTS = ("off", "on", "store")


class TimedRecording(RFTJob):
    """An RFTJob that times its own sample recording (building the records, the file, TensorBoard, listeners):
    the cost measured directly, which the load of other processes hardly blurs, beside the A/B step times."""

    recording_s: dict[str, list[float]]

    def _record_samples(self, kind, step, groups, advantages=None) -> None:
        started = time.perf_counter()
        super()._record_samples(kind, step, groups, advantages)
        self.recording_s.setdefault(kind, []).append(time.perf_counter() - started)


def run_once(variant: str, steps: int, workdir: Path) -> dict:
    spec = demo_spec(threads=None, total_steps=steps)
    spec.tracking.tensorboard = True  # the demo's own setting: the samples' text goes there too
    if variant == "off":
        spec.tracking.sample_prompts_per_step = 0
        spec.tracking.eval_samples = False
    run_dir = workdir / f"{variant}-{time.monotonic_ns()}"
    listeners, store = (), None
    if variant == "store":  # what the service's job process adds: each recording into the job store
        store = Store.open(f"sqlite:///{run_dir}.db")
        cap = int(spec.tracking.samples_max_mb * 2**20)
        listeners = (lambda kind, step, records: store.add_samples("ftjob-bench", records, cap),)
    started = time.perf_counter()
    job = TimedRecording(spec, run_dir, show_progress=False, sample_listeners=listeners)
    job.recording_s = {}
    summary = job.run()
    wall = time.perf_counter() - started
    if store is not None:
        store.close()
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
        "record_train_ms": 1000 * statistics.median(job.recording_s.get("train", [0.0])),
        "record_eval_ms": 1000 * statistics.median(job.recording_s.get("eval", [0.0])),
        "record_total_s": sum(sum(v) for v in job.recording_s.values()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.samples")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    load_before = load_average()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]  # alternate the order
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
    store_step_ratio = median_of("store", "median_step_s") / median_of("off", "median_step_s")
    direct = {
        variant: median_of(variant, "record_train_ms") / 1000 / median_of("off", "median_step_s")
        for variant in ("on", "store")
    }
    direct_job = {
        variant: median_of(variant, "record_total_s") / median_of("off", "job_wall_s") for variant in ("on", "store")
    }
    store_wall_ratio = median_of("store", "job_wall_s") / median_of("off", "job_wall_s")
    same_curve = len({r["final_val_reward"] for r in runs}) == 1
    columns = [
        ("round", "round:"),
        ("variant", "samples"),
        ("median_step_s", "median s/step:"),
        ("job_wall_s", "job wall s:"),
        ("samples", "samples recorded:"),
        ("samples_bytes", "samples bytes:"),
        ("record_train_ms", "recording ms/step:"),
        ("record_eval_ms", "recording ms/evaluation:"),
        ("record_total_s", "recording s in all:"),
        ("final_val_reward", "final val reward:"),
    ]
    body = [
        f"The demo job (`examples/arithmetic/recipe.yaml`, {args.steps} steps, TensorBoard on), samples off "
        "(`sample_prompts_per_step: 0`, `eval_samples: false`), on (the defaults: 2 prompts x 8 samples per "
        "step, every validation sample at each evaluation, to `samples.jsonl` and TensorBoard) and "
        "`store` (on, and each recording also added to a SQLite job store, as a service job does), in turn, "
        f"{args.rounds} rounds. The machine was shared with other jobs: compare the ratios, not the seconds.",
        "",
        *markdown_table(columns, runs),
        "",
        f"- median step time, on / off: **{step_ratio:.3f}** (the goal: at most 1.05)",
        f"- job wall time (with evaluations and model loading), on / off: **{wall_ratio:.3f}**",
        f"- with the job store, store / off: step **{store_step_ratio:.3f}**, job wall **{store_wall_ratio:.3f}**",
        "- measured directly (the time inside the recording, against the off runs' median step and job time): "
        f"a step's training samples {100 * direct['on']:.2f}% of a step ({100 * direct['store']:.2f}% with the "
        f"store); all recording {100 * direct_job['on']:.2f}% of the job ({100 * direct_job['store']:.2f}% with "
        "the store)",
        f"- the same final validation reward in every run: {same_curve}",
    ]
    data = {
        "runs": runs,
        "step_ratio": step_ratio,
        "wall_ratio": wall_ratio,
        "store_step_ratio": store_step_ratio,
        "store_wall_ratio": store_wall_ratio,
        "recording_share_of_step": direct,
        "recording_share_of_job": direct_job,
        "load": {"before": load_before, "after": load_average()},
    }
    kwargs = {"results_dir": args.out} if args.out else {}
    path = write_results("samples", "Recording samples: the demo job with samples off and on", body, data, **kwargs)
    print(f"step ratio {step_ratio:.3f}, wall ratio {wall_ratio:.3f}; wrote {path}")


if __name__ == "__main__":
    main()
