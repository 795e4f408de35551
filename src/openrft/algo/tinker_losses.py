"""The Tinker API's losses: the registry's (``algo/losses.py``) as Tinker documents them, per datum,
summed over its tokens.

Every tensor of a datum is aligned with its ``model_input``: position ``i`` holds what the input's
position ``i`` predicts (token ``i + 1`` of the full sequence). ``target_logprobs`` are the learner's
log-probabilities of ``target_tokens`` (temperature 1). A datum's loss is the sum over its tokens of the
registry's per-token loss (no mean: the caller scales the advantages or weights), with ``q`` the datum's
``logprobs``, or for a ``recorded`` loss (``stable_reinforce``) the log-probs the server recorded when
it sampled the tokens (``recorded_logprobs``, resolved from the datum's provenance by the server).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from openrft.algo import losses
from openrft.algo.losses import LossBatch, LossConfigError


class LossInputError(ValueError):
    """A datum or loss configuration the loss cannot take; the message names the field and the value."""


RECORDED = "recorded_logprobs"
"""The inputs key under which the server passes a recorded loss its recorded sampling log-probs."""


def resolve_config(loss_fn: str, config: Mapping[str, float] | None) -> dict[str, float]:
    """The loss's configuration: its defaults overridden by ``config``; unknown keys and bad values refused."""
    try:
        return losses.resolve_config(loss_fn, config, tinker=True)
    except LossConfigError as exc:
        raise LossInputError(str(exc)) from None


def needs_recording(loss_fn: str) -> bool:
    """Whether the loss reads the log-probs the server recorded at sampling time (the datum's provenance)."""
    return losses.LOSSES[loss_fn].recorded


def check_inputs(loss_fn: str, inputs: Mapping[str, torch.Tensor], length: int, datum: int) -> None:
    """Every input the loss needs, each of shape ``(length,)``; optional ones allowed; nothing else."""
    entry = losses.LOSSES[loss_fn]
    needed, optional = entry.inputs, entry.optional
    where = f"data[{datum}].loss_fn_inputs"
    missing = [k for k in needed if k not in inputs]
    if missing:
        raise LossInputError(f"{where} lacks {', '.join(missing)}: {loss_fn} needs {', '.join(needed)}")
    extra = [k for k in inputs if k not in needed and k not in optional]
    if extra:
        takes = ", ".join(needed) + (f" (optional: {', '.join(optional)})" if optional else "")
        raise LossInputError(f"{where}.{extra[0]} is not an input of {loss_fn} (it takes {takes})")
    for key in [k for k in (*needed, *optional) if k in inputs]:
        shape = tuple(inputs[key].shape)
        if shape != (length,):
            raise LossInputError(
                f"{where}.{key} has shape {list(shape)}; it must be [{length}], the length of the datum's model_input"
            )
        if key != "target_tokens" and not bool(torch.isfinite(inputs[key]).all()):
            raise LossInputError(f"{where}.{key} holds a non-finite value")


def datum_loss(loss_fn: str) -> Callable[[torch.Tensor, Mapping[str, torch.Tensor], Mapping[str, float]], torch.Tensor]:
    """The datum's loss (a scalar, the sum over its tokens) of the registry's ``loss_fn``."""
    entry = losses.LOSSES[loss_fn]

    def compute(logp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]) -> torch.Tensor:
        if entry.recorded and RECORDED not in inputs:
            raise LossInputError(
                f"{loss_fn} takes the log-probs recorded when the tokens were sampled: sample with "
                "record_stability_info=True and give each datum its provenance (Datum.with_provenance)"
            )
        q = inputs[RECORDED] if entry.recorded else inputs.get("logprobs")
        advantages = inputs.get("advantages")
        extra = {k: v[None] for k, v in inputs.items() if k in ("weights", "sequence_ratio_mask")}
        batch = LossBatch(
            logp[None],
            None if q is None else q[None].to(logp.dtype),
            None if advantages is None else advantages[None].to(logp.dtype),
            torch.ones_like(logp[None]),
            extra,
        )
        per_token, _ = entry.fn(batch, config)
        return per_token.sum()

    return compute


class _Losses(Mapping):
    """``LOSSES[name](logp, inputs, config)``: the datum's loss, for every loss the Tinker API serves."""

    def __getitem__(self, name: str):
        if name not in losses.names(tinker=True):
            raise KeyError(name)
        return datum_loss(name)

    def __iter__(self):
        return iter(losses.names(tinker=True))

    def __len__(self) -> int:
        return len(losses.names(tinker=True))


LOSSES = _Losses()
