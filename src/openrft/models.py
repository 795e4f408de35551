"""Model names -> loaded models: the bundled ``openrft-demo``, local paths, Hugging Face ids."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from openrft.errors import ModelNotFoundError

ASSETS = Path(__file__).resolve().parent / "assets"
REGISTERED_MODELS = {"openrft-demo": ASSETS / "demo_model"}


def resolve_model_path(name_or_path: str) -> str:
    """A registered name's directory, an existing local path, or the name itself (a hub id)."""
    if name_or_path in REGISTERED_MODELS:
        return str(REGISTERED_MODELS[name_or_path])
    path = Path(name_or_path).expanduser()
    if path.exists():
        return str(path)
    if path.is_absolute() or name_or_path.startswith((".", "~")):
        raise ModelNotFoundError(f"model path {name_or_path!r} does not exist")
    return name_or_path


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelNotFoundError(f"device {requested!r} was asked for but no CUDA device is available")
    return device


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested != "auto":
        return getattr(torch, requested)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run a block with this thread's torch thread count set to ``count`` (an OpenMP setting of the calling
    thread), restored after."""
    before = torch.get_num_threads()
    if count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def configure_threads(threads: int | None, measured: bool = False) -> int:
    """Set torch's intra-op threads: ``threads``, or the engine's choice for this machine.

    The choice is one thread per physical core this process may run on (hyper-threads slow
    matmuls; a container's CPU set can be smaller than the machine), but no more than the cores
    left idle by other processes at the start (the 1-minute load average): on a shared machine,
    threads beyond the idle cores only wait for each other (docs/performance.md, "Threads").
    ``measured``: the caller measures its layouts per phase (``engine/phase_threads.py``), so every
    core is offered whatever the load average says (a busy core shows in the measurement; the
    average also counts the caller's own work of a minute ago, such as the job run before).
    """
    if threads is None:
        load = 0.0 if measured or not hasattr(os, "getloadavg") else os.getloadavg()[0]
        threads = default_threads(*machine_cpus(), load)
    torch.set_num_threads(threads)
    return threads


def machine_cpus() -> tuple[int, int]:
    """(physical cores, logical CPUs) available to this process."""
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        import psutil

        physical = psutil.cpu_count(logical=False) or logical
    except ImportError:
        physical = logical
    return min(physical, logical), logical


def default_threads(physical: int, logical: int, load: float) -> int:
    """One per physical core, capped by the CPUs other processes leave idle (never fewer than one)."""
    idle = int(logical - load + 0.5)
    return max(1, min(physical, idle))


def load_tokenizer(name_or_path: str, revision: str | None = None):
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    except OSError as exc:
        raise ModelNotFoundError(f"cannot load a tokenizer for model {name_or_path!r}: {exc}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(name_or_path: str, device: torch.device, dtype: torch.dtype, revision: str | None = None):
    from transformers import AutoModelForCausalLM

    from openrft.attention import use_chunked_sdpa

    path = resolve_model_path(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, revision=revision, dtype=dtype)
    except OSError as exc:
        raise ModelNotFoundError(f"cannot load model {name_or_path!r}: {exc}") from None
    use_chunked_sdpa(model)  # long sequences without a [queries, keys] mask (attention.py)
    without_hub_kernels(model)
    return model.to(device)


def without_hub_kernels(model) -> None:
    """Turn off transformers' Hub kernels (``use_kernels``, on by default since transformers 5 where the ``kernels``
    package is installed): they would be fetched from the Hub at run time, and every ``train()``/``eval()`` of the
    model re-kernelizes it, 5-7 ms on the demo model, twice a step. The model computes the same without them."""
    if getattr(model, "use_kernels", False) and hasattr(model, "set_use_kernels"):
        model.set_use_kernels(False)


def eos_token_ids(tokenizer, model) -> list[int]:
    """Every token that ends an answer: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(configured)
    return sorted(i for i in ids if i is not None)
