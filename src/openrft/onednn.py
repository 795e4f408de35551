"""Linear layers on oneDNN with their weights packed, for generation (``rollout/onednn.py``) and the learner's frozen
base weights (``learner/onednn.py``).

torch's CPU ``linear`` calls MKL's sgemm, which on some CPUs runs a transformer's shapes well below the machine's
peak. oneDNN's ``_linear_pointwise`` (the op torch's own compiler emits for CPU linears) on a packed copy of the
weight runs them faster. On an AMD EPYC at Qwen2.5-0.5B's shapes, 2 threads (docs/performance.md, "What each
optimisation buys"): 64 rows (a decode step) 80-114 GFLOP/s against 131-148 on the MLP's projections; 1,024 rows (a
learner's micro-batch) 87-149 against 117-177, forward and the input's gradient alike; the LM head's 151,936 rows
49-75 against 133-149 for a chunk of 110 tokens.

A packed copy costs the weight's memory again and one pass over it to make, so it is made for a scope (one
``generate`` call, one learner's pass over a batch) and freed at its end: nothing holds it between, and a weight
changed in place is never computed from a stale copy (``_version``). Where the copy cannot serve, the layer runs
torch's ``linear``: another dtype, a gradient for the weight or the bias, a gradient for the input without a packed
transpose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MIN_WEIGHT = 1 << 16
"""Weights with fewer elements keep torch's ``linear``: LoRA's factors and toy models, where a call's overhead wins."""


def available() -> bool:
    """Whether this torch has oneDNN on CPU and its dense-input linear."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._linear_pointwise  # noqa: B018 - resolving the op is the check
    except (AttributeError, RuntimeError):
        return False
    return True


def linear(x2d: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x2d @ W.T + bias`` for a contiguous fp32 ``x2d`` and ``packed`` = ``W.to_mkldnn()``; a dense result."""
    return torch.ops.mkldnn._linear_pointwise(x2d, packed, bias, "none", [], "")


def packable(module: torch.nn.Module) -> bool:
    """A plain fp32 ``nn.Linear`` with a plain weight (not a sharded ``DTensor``) on a CPU, large enough, whose
    ``forward`` nobody else has replaced (the sharded learner's vocabulary-parallel head sets its own)."""
    weight = getattr(module, "weight", None)
    return (
        type(module) is torch.nn.Linear
        and "forward" not in module.__dict__
        and weight is not None
        and type(weight.detach()) is torch.Tensor
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.numel() >= MIN_WEIGHT
    )


def frozen(layer: torch.nn.Linear) -> bool:
    """Neither the weight nor the bias of ``layer`` trains."""
    return not layer.weight.requires_grad and (layer.bias is None or not layer.bias.requires_grad)


def packed_bytes(weights: Sequence[torch.Tensor], with_transpose: bool) -> int:
    """Memory the packed copies of ``weights`` take (twice that with their transposes)."""
    return sum(w.numel() * w.element_size() for w in weights) * (2 if with_transpose else 1)


@dataclass(eq=False)
class PackedWeight:
    """Packed copies of ``weight`` (and of its transpose) as it was at ``version``."""

    weight: torch.Tensor
    version: int
    forward: torch.Tensor
    transpose: torch.Tensor | None

    @classmethod
    def of(cls, weight: torch.Tensor, with_transpose: bool) -> PackedWeight:
        plain = weight.detach()
        transpose = plain.t().contiguous().to_mkldnn() if with_transpose else None
        return cls(weight, weight._version, plain.to_mkldnn(), transpose)

    @property
    def current(self) -> bool:
        """False once the weight changed in place since packing (an optimizer step, a learner in another thread)."""
        return self.weight._version == self.version


_packed_matrices: dict[int, PackedWeight] = {}
"""Weights packed for computations that are not a layer's forward (the learner's chunked LM head), by ``id``."""


def _registered(weight: torch.Tensor, transpose: bool) -> PackedWeight | None:
    entry = _packed_matrices.get(id(weight))
    usable = entry is not None and entry.weight is weight and entry.current
    return entry if usable and (not transpose or entry.transpose is not None) else None


def times_transpose(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """``x2d @ weight.T`` on the registered packed copy of ``weight``; None where there is none (or ``x2d`` is not
    fp32), for the caller to compute it with torch."""
    entry = _registered(weight, transpose=False) if x2d.dtype == torch.float32 else None
    return None if entry is None else linear(x2d.contiguous(), entry.forward, None)


def times(x2d: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """``x2d @ weight`` on the registered packed transpose of ``weight``; None where there is none."""
    entry = _registered(weight, transpose=True) if x2d.dtype == torch.float32 else None
    return None if entry is None else linear(x2d.contiguous(), entry.transpose, None)


class _FrozenLinear(torch.autograd.Function):
    """``linear(x, W, b)`` for a frozen ``W`` and ``b``: forward on the packed ``W``, the input's gradient on the
    packed ``W.T`` (``grad @ W``); no gradient for either weight."""

    @staticmethod
    def forward(ctx, x2d, packed, packed_t, bias):
        ctx.packed_t = packed_t
        return linear(x2d, packed, bias)

    @staticmethod
    def backward(ctx, grad):
        return linear(grad.contiguous(), ctx.packed_t, None), None, None, None


def _packed_forward(layer: torch.nn.Linear, with_transpose: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    packed = PackedWeight.of(layer.weight, with_transpose)

    def forward(x: torch.Tensor) -> torch.Tensor:
        grad = torch.is_grad_enabled()
        needs_input_grad = grad and x.requires_grad
        if (
            x.dtype != torch.float32
            or not packed.current
            or (grad and not frozen(layer))
            or (needs_input_grad and packed.transpose is None)
        ):
            return F.linear(x, layer.weight, layer.bias)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        bias = None if layer.bias is None else layer.bias.detach()
        if needs_input_grad:
            y = _FrozenLinear.apply(flat, packed.forward, packed.transpose, bias)
        else:
            y = linear(flat, packed.forward, bias)
        return y.view(*x.shape[:-1], layer.out_features)

    return forward


@contextmanager
def packed(
    layers: Sequence[torch.nn.Linear], with_transpose: bool, matrices: Sequence[torch.Tensor] = ()
) -> Iterator[int]:
    """Inside, ``layers`` (all ``packable``) compute on oneDNN with packed copies of their weights (and of their
    transposes, for the input's gradient, when ``with_transpose``), and ``times_transpose`` / ``times`` compute on
    packed copies of ``matrices``; yields how many layers. Each layer's own ``forward`` is back when it exits, and
    the copies are freed."""
    installed, registered = [], []
    try:
        for layer in layers:
            layer.forward = _packed_forward(layer, with_transpose)
            installed.append(layer)
        for matrix in matrices:
            _packed_matrices[id(matrix)] = PackedWeight.of(matrix, with_transpose)
            registered.append(id(matrix))
        yield len(installed)
    finally:
        for layer in installed:
            layer.__dict__.pop("forward", None)
        for key in registered:
            _packed_matrices.pop(key, None)
