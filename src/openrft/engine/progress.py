"""What a person watching ``openrft train`` sees: a live bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


def _fmt(value: float | None) -> str:
    return "  -  " if value is None else f"{value:.3f}"


class ProgressReporter:
    def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.total = total_steps
        self.started = time.monotonic()
        self.start_step = start_step
        self.reward: float | None = None
        self.val_reward: float | None = None
        self._progress: Progress | None = None
        if enabled and self.console.is_terminal:
            self._progress = Progress(
                TextColumn("[bold]RFT"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("reward {task.fields[reward]}  eval {task.fields[val]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task(
                "train", total=total_steps, completed=start_step, reward=_fmt(None), val=_fmt(None)
            )
            self._progress.start()

    def log(self, message: str) -> None:
        if self.enabled:
            self.console.print(message)

    def eval_done(self, step: int, mean_reward: float, pass_rate: float) -> None:
        self.val_reward = mean_reward
        self.log(f"eval @ step {step}: validation reward {mean_reward:.3f}, pass rate {pass_rate:.1%}")
        if self._progress is not None:
            self._progress.update(self._task, val=_fmt(mean_reward))

    def step_done(self, step: int, reward: float | None, seconds: float) -> None:
        self.reward = reward
        if self._progress is not None:
            self._progress.update(self._task, completed=step, reward=_fmt(reward))
        elif self.enabled:
            done = step - self.start_step
            elapsed = time.monotonic() - self.started
            eta = elapsed / done * (self.total - step) if done else 0.0
            self.console.print(
                f"step {step}/{self.total}  reward {_fmt(reward)}  eval {_fmt(self.val_reward)}  "
                f"{seconds:.2f}s/step  ETA {eta:.0f}s"
            )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def summary(self, summary: dict) -> None:
        if not self.enabled:
            return
        table = Table(title="OpenRFT run summary", show_header=False)
        baseline, final = summary.get("baseline_val_reward"), summary.get("final_val_reward")
        table.add_row("validation reward (baseline)", _fmt(baseline))
        table.add_row("validation reward (final)", _fmt(final))
        if baseline is not None and final is not None:
            table.add_row("improvement", f"{(final - baseline) * 100:+.1f} points")
        table.add_row("steps", str(summary["steps"]))
        table.add_row("wall time", f"{summary['wall_seconds']:.0f} s")
        table.add_row("adapter", summary["adapter_path"])
        if summary.get("best_checkpoint"):
            table.add_row("best checkpoint", summary["best_checkpoint"])
        self.console.print(table)
