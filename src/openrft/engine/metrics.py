"""One place that writes metrics: ``metrics.jsonl``, TensorBoard, and any listeners (events, MLflow)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

MetricsListener = Callable[[int, dict[str, float]], None]


def truncate_metrics_file(path: Path, last_step: int) -> None:
    """Drop lines past ``last_step`` (a resumed run rewrites them), atomically."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsSink:
    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self._listeners: list[MetricsListener] = []

    def add_listener(self, listener: MetricsListener) -> None:
        self._listeners.append(listener)

    def emit(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        if self._writer is not None:
            for name, value in clean.items():
                self._writer.add_scalar(name, value, global_step=step)
            self._writer.flush()
        for listener in self._listeners:
            listener(step, clean)

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()
