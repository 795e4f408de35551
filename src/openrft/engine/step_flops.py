"""How close each step comes to the machine: its model FLOPs over its time, over the matmul peak of this machine.

Each step's metrics carry the model FLOPs (``openrft.learner.flops``: matmuls only, the passes the step needs) of
its generation and of its learning, divided by their seconds and by the peak: ``perf/generate_flops_fraction``
(sampling alone, reward scoring left out; only where the job samples in its own turn: synchronous rollouts),
``perf/learn_flops_fraction`` (the learner's update over its own time) and ``perf/step_flops_fraction`` (both
phases' FLOPs over the whole step's time, rewards and bookkeeping included: the share of the machine the step
turned into model work).

The peak is the best FLOP/s of square matmuls (256 to 1024) in the learner's dtype, on the device and thread count
the job runs with, measured when the job starts (about 0.6 s). It is kept per process and, on disk, per machine,
device, dtype, threads and torch version for a day (``$XDG_CACHE_HOME/openrft/matmul_peak.json``), so that a
service running many jobs measures it once; ``OPENRFT_MATMUL_PEAK_FLOPS`` sets it instead (a known figure, or a
GPU's nominal peak).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from openrft.learner.flops import DecoderShape, generation_flops, learner_step_flops

CACHE_SECONDS = 24 * 3600
PEAK_SIZES = (256, 512, 1024)
_peaks: dict[str, float] = {}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops(device: torch.device, dtype: torch.dtype, size: int = 1024, seconds: float = 1.0) -> float:
    """Measured FLOP/s of a square ``size`` matmul on this device and thread setting, the best of
    repeated runs for ``seconds``."""
    noise = torch.Generator(device=device).manual_seed(0)  # the job's own random stream left as it was
    a = torch.randn(size, size, device=device, dtype=dtype, generator=noise)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=noise)
    torch.mm(a, b)
    sync(device)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def matmul_peak(
    device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] = (256, 512, 1024, 2048), seconds: float = 0.5
) -> tuple[float, dict[int, float]]:
    """The machine's measured matmul FLOP/s: the best square size (a size that fits the caches wins on a CPU),
    and every size's figure."""
    by_size = {size: matmul_flops(device, dtype, size, seconds) for size in sizes}
    return max(by_size.values()), by_size


def _cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "openrft" / "matmul_peak.json"


def _key(device: torch.device, dtype: torch.dtype) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return f"{platform.node()}|{name}|{device}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def machine_peak(device: torch.device, dtype: torch.dtype) -> float:
    """The matmul peak the step's FLOPs are compared with (see the module's docstring for where it comes from)."""
    override = os.environ.get("OPENRFT_MATMUL_PEAK_FLOPS")
    if override:
        return float(override)
    key = _key(device, dtype)
    if key in _peaks:
        return _peaks[key]
    path = _cache_file()
    try:
        cached = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        cached = None
    if cached and time.time() - cached.get("at", 0) < CACHE_SECONDS:
        _peaks[key] = float(cached["flops"])
        return _peaks[key]
    peak, _ = matmul_peak(device, dtype, PEAK_SIZES, seconds=0.2)
    _peaks[key] = peak
    try:  # best effort: a read-only home only means measuring again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        table[key] = {"flops": peak, "at": time.time()}
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(table, indent=1))
        temporary.replace(path)
    except OSError:
        pass
    return peak


@dataclass
class StepFlops:
    """A job's FLOP accounting: its model's shape, what its learner trains, the machine's peak."""

    shape: DecoderShape
    lora_rank: int  # 0: the adapter is off (full-rank training)
    full_rank: bool
    reference: bool  # the KL term's reference forward
    peak: float

    @classmethod
    def for_model(cls, model, spec) -> StepFlops | None:
        """For a job whose model is in this process (None where its learners are elsewhere, or not a decoder)."""
        config = getattr(model, "config", None)
        try:
            shape = DecoderShape.from_config(config)
        except AttributeError:
            return None
        parameter = next(model.parameters())
        dtype = parameter.dtype if parameter.dtype.is_floating_point else torch.float32
        rank = spec.lora.rank if spec.lora.enabled else 0
        return cls(
            shape, rank, not spec.lora.enabled, spec.algorithm.kl_loss_coef > 0, machine_peak(parameter.device, dtype)
        )

    def metrics(
        self, groups, samples, step_s: float, generate_s: float | None, learn_s: float | None
    ) -> dict[str, float]:
        """The step's FLOPs and fractions; ``generate_s``/``learn_s`` None where that phase was not timed alone."""
        prompts = [len(g.prompt_ids) for g in groups]
        responses = [[len(c.token_ids) for c in g.completions] for g in groups]
        generate = generation_flops(self.shape, prompts, responses, self.lora_rank)
        learn = learner_step_flops(self.shape, samples, self.lora_rank, self.reference, full_rank=self.full_rank)
        metrics = {
            "perf/step_flops": float(generate + learn),
            "perf/matmul_peak_flops": self.peak,
            "perf/step_flops_fraction": (generate + learn) / step_s / self.peak,
        }
        if learn_s and samples:
            metrics["perf/learn_flops_fraction"] = learn / learn_s / self.peak
        if generate_s:
            metrics["perf/generate_flops_fraction"] = generate / generate_s / self.peak
        return metrics
