"""``openrft plot RUN_DIR [RUN_DIR ...] -o curve.png``: the train reward (with its min/max band) and validation
curves; with several run directories, every run's curves on the same axes."""

from __future__ import annotations

import argparse
from pathlib import Path

from openrft.errors import OpenRFTError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw runs' reward and validation curves to an image (several runs overlaid)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--output", "-o", default=None, help="image path (default: RUN_DIR/curve.png of the first run)")
    p.add_argument("--all", action="store_true", help="every dashboard chart, not just the rewards")
    p.set_defaults(handler=run)


def run_label(run_dir: Path, taken: set[str]) -> str:
    """A run's name in a legend: its directory name, with its parent's where two runs share a name."""
    label = run_dir.resolve().name
    if label in taken:
        label = f"{run_dir.resolve().parent.name}/{label}"
    taken.add(label)
    return label


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from openrft.charts import CHARTS, REWARD_CHARTS, charts_data, overlaid
    from openrft.engine.metrics import read_metrics

    runs, taken = [], set()
    for run_dir in map(Path, args.run_dirs):
        rows = read_metrics(run_dir / "metrics.jsonl")
        if not rows:
            raise OpenRFTError(f"{run_dir} has no metrics.jsonl with any step")
        runs.append((run_label(run_dir, taken), rows))
    chosen = CHARTS if args.all else REWARD_CHARTS
    charts = charts_data(runs[0][1], chosen) if len(runs) == 1 else overlaid(runs, chosen)
    fig, axes = plt.subplots(len(charts), 1, figsize=(8, 2.8 * len(charts)), sharex=True, squeeze=False)
    for ax, data in zip(axes[:, 0], charts):
        for line in data.lines:
            ax.plot(line.steps, line.values, marker="o" if len(line.steps) < 30 else None, label=line.name)
        if data.band:
            low, high = data.band
            ax.fill_between(low.steps, low.values, high.values, alpha=0.2, label="min/max")
        ax.set_title(data.chart.title)
        ax.grid(alpha=0.3)
        if data.lines:
            ax.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    output = Path(args.output or Path(args.run_dirs[0]) / "curve.png")
    fig.savefig(output, dpi=110)
    print(f"wrote {output}")
    return 0
