"""One place that writes metrics and recorded samples: ``metrics.jsonl``, ``samples.jsonl``, TensorBoard, and any
listeners (events, MLflow, the service's store)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openrft.disk_full import append_line, trim_torn_tail
from openrft.engine.samples import SampleListener, SampleLog, samples_markdown

MetricsListener = Callable[[int, dict[str, float]], None]


def truncate_metrics_file(path: Path, last_step: int) -> None:
    """Drop lines past ``last_step`` (a resumed run rewrites them) and a torn last line, atomically."""
    if not path.exists():
        return
    trim_torn_tail(path)
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    tmp.replace(path)


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    text = path.read_text()
    if not text.endswith("\n"):  # a last line torn by a crash: not a step
        text = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class MetricsSink:
    def __init__(self, run_dir: Path, tensorboard: bool = True, samples: SampleLog | None = None):
        self.path = run_dir / "metrics.jsonl"
        self.path.touch()
        self.samples = samples
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self._listeners: list[MetricsListener] = []
        self._sample_listeners: list[SampleListener] = []

    def add_listener(self, listener: MetricsListener) -> None:
        self._listeners.append(listener)

    def add_sample_listener(self, listener: SampleListener) -> None:
        self._sample_listeners.append(listener)

    def emit_samples(self, kind: str, step: int, records: list[dict[str, Any]]) -> None:
        """Recorded samples (``engine/samples.py``): to ``samples.jsonl``, TensorBoard's text tab, listeners."""
        if not records:
            return
        if self.samples is not None:
            self.samples.write(records)
        if self._writer is not None:
            self._writer.add_text(f"samples/{kind}", samples_markdown(records), global_step=step)
            self._writer.flush()
        for listener in self._sample_listeners:
            listener(kind, step, records)

    def emit(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        append_line(self.path, json.dumps({"step": step, **clean}))  # whole or not at all, on a full disk too
        if self._writer is not None:
            for name, value in clean.items():
                self._writer.add_scalar(name, value, global_step=step)
            self._writer.flush()
        for listener in self._listeners:
            listener(step, clean)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
