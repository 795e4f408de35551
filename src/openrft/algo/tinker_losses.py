"""The Tinker API's built-in losses, as its documentation defines them: per datum, summed over tokens.

Every tensor of a datum is aligned with its ``model_input``: position ``i`` holds what the input's
position ``i`` predicts (token ``i + 1`` of the full sequence). ``target_logprobs`` are the learner's
log-probabilities of ``target_tokens`` (temperature 1). Each function returns the datum's loss, a
scalar that is the sum over its tokens (no mean: the caller scales the advantages or weights).

  cross_entropy        -(logp * weights).sum()
  importance_sampling  -(exp(logp - q) * A).sum()
  ppo                  -min(r * A, clip(r, low, high) * A).sum()           low, high = 0.8, 1.2
  cispo                -(sg(clip(r, low, high)) * logp * A).sum()          low, high = 0.0, 4.0
  dro                  -(logp * A - beta / 2 * (logp - q) ** 2).sum()      beta = 0.1

with ``q`` the sampler's log-probs (``logprobs``), ``A`` the ``advantages`` and ``r = exp(logp - q)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch


class LossInputError(ValueError):
    """A datum or loss configuration the loss cannot take; the message names the field and the value."""


INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
}
CONFIG_DEFAULTS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 0.1},
}


def resolve_config(loss_fn: str, config: Mapping[str, float] | None) -> dict[str, float]:
    """The loss's configuration: its defaults overridden by ``config``; unknown keys and bad values refused."""
    if loss_fn not in CONFIG_DEFAULTS:
        raise LossInputError(f"loss_fn {loss_fn!r} is not supported; supported: {', '.join(CONFIG_DEFAULTS)}")
    resolved = dict(CONFIG_DEFAULTS[loss_fn])
    for key, value in (config or {}).items():
        if key not in resolved:
            allowed = ", ".join(resolved) or "none"
            raise LossInputError(f"loss_fn_config.{key} is not a setting of {loss_fn} (allowed: {allowed})")
        if isinstance(value, str) or not math.isfinite(float(value)):
            raise LossInputError(f"loss_fn_config.{key} must be a finite number, got {value!r}")
        resolved[key] = float(value)
    if "clip_low_threshold" in resolved:
        low, high = resolved["clip_low_threshold"], resolved["clip_high_threshold"]
        if not 0 <= low <= high:
            raise LossInputError(
                f"loss_fn_config needs 0 <= clip_low_threshold <= clip_high_threshold, got {low}, {high}"
            )
    if resolved.get("beta", 0.0) < 0:
        raise LossInputError(f"loss_fn_config.beta must be >= 0, got {resolved['beta']}")
    return resolved


def check_inputs(loss_fn: str, inputs: Mapping[str, torch.Tensor], length: int, datum: int) -> None:
    """Every input the loss needs, each of shape ``(length,)``, nothing else."""
    needed = INPUTS[loss_fn]
    where = f"data[{datum}].loss_fn_inputs"
    missing = [k for k in needed if k not in inputs]
    if missing:
        raise LossInputError(f"{where} lacks {', '.join(missing)}: {loss_fn} needs {', '.join(needed)}")
    extra = [k for k in inputs if k not in needed]
    if extra:
        raise LossInputError(f"{where}.{extra[0]} is not an input of {loss_fn} (it takes {', '.join(needed)})")
    for key in needed:
        shape = tuple(inputs[key].shape)
        if shape != (length,):
            raise LossInputError(
                f"{where}.{key} has shape {list(shape)}; it must be [{length}], the length of the datum's model_input"
            )
        if key != "target_tokens" and not bool(torch.isfinite(inputs[key]).all()):
            raise LossInputError(f"{where}.{key} holds a non-finite value")


def cross_entropy(logp: torch.Tensor, inputs: Mapping[str, torch.Tensor], _: Mapping[str, float]) -> torch.Tensor:
    return -(logp * inputs["weights"]).sum()


def importance_sampling(logp: torch.Tensor, inputs: Mapping[str, torch.Tensor], _: Mapping[str, float]) -> torch.Tensor:
    ratio = torch.exp(logp - inputs["logprobs"])
    return -(ratio * inputs["advantages"]).sum()


def ppo(logp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]) -> torch.Tensor:
    advantages = inputs["advantages"]
    ratio = torch.exp(logp - inputs["logprobs"])
    clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


def cispo(logp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]) -> torch.Tensor:
    ratio = torch.exp(logp - inputs["logprobs"])
    coefficient = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"]).detach()
    return -(coefficient * logp * inputs["advantages"]).sum()


def dro(logp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]) -> torch.Tensor:
    penalty = (logp - inputs["logprobs"]) ** 2
    return -(logp * inputs["advantages"] - 0.5 * config["beta"] * penalty).sum()


LOSSES: dict[str, Callable[[torch.Tensor, Mapping[str, torch.Tensor], Mapping[str, float]], torch.Tensor]] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
}
