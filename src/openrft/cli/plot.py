"""``openrft plot RUN_DIR -o curve.png``: the train reward (with its min/max band) and validation curves."""

from __future__ import annotations

import argparse
from pathlib import Path

from openrft.errors import OpenRFTError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="draw a run's reward and validation curves to an image")
    p.add_argument("run_dir")
    p.add_argument("--output", "-o", default=None, help="image path (default: RUN_DIR/curve.png)")
    p.add_argument("--all", action="store_true", help="every dashboard chart, not just the rewards")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from openrft.charts import CHARTS, REWARD_CHARTS, charts_data
    from openrft.engine.metrics import read_metrics

    run_dir = Path(args.run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows:
        raise OpenRFTError(f"{run_dir} has no metrics.jsonl with any step")
    charts = charts_data(rows, CHARTS if args.all else REWARD_CHARTS)
    fig, axes = plt.subplots(len(charts), 1, figsize=(8, 2.8 * len(charts)), sharex=True, squeeze=False)
    for ax, data in zip(axes[:, 0], charts):
        for line in data.lines:
            ax.plot(line.steps, line.values, marker="o" if len(line.steps) < 30 else None, label=line.name)
        if data.band:
            low, high = data.band
            ax.fill_between(low.steps, low.values, high.values, alpha=0.2, label="min/max")
        ax.set_title(data.chart.title)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    output = Path(args.output or run_dir / "curve.png")
    fig.savefig(output, dpi=110)
    print(f"wrote {output}")
    return 0
