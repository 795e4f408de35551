"""The policy losses by name: one registry that jobs (``algorithm.loss_fn``) and the Tinker API's
``forward_backward`` (``loss_fn``) both read (docs/algorithm.md, "Losses by name").

Each loss is a per-token function of a ``LossBatch`` (tensors ``[rows, tokens]``) and its resolved
configuration, returning the per-token loss and where a clip or mask was active. Callers aggregate:

- a job's learner sums ``mask * loss`` over its micro-batch and divides by the update's token count
  (token-level aggregation, docs/algorithm.md), with its KL, entropy, ``loss_scale`` and rollout
  correction around it (``algo.loss.policy_loss_terms``);
- the Tinker API sums each datum's tokens (``mask`` all ones), as Tinker documents its losses.

With ``logp`` the learner's log-prob of each token, ``q`` the log-prob the ratio is taken against
(``old_logp``: a job's anchor; a Tinker datum's ``logprobs``, or for ``stable_reinforce`` what the
server recorded when it sampled), ``A`` the token's advantage, ``r = exp(logp - q)`` and ``sg`` the
stop-gradient:

  grpo                 -min(r*A, clip(r, 1-low, 1+high)*A), dual clip -c*A for A < 0    (jobs only; default)
  cross_entropy        -weights * logp                                                (Tinker only)
  importance_sampling  -r * A
  ppo                  -min(r*A, clip(r, low, high)*A)                                 low, high = 0.8, 1.2
  cispo                -sg(clip(r, low, high)) * logp * A                             low, high = 0.0, 4.0
  dro                  -(logp*A - beta/2 * (logp - q)^2)                               beta = 0.1
  gspo                 -min(s_t*A, clip(s_t, low, high)*A), s_t = sg(s) * exp(logp - sg(logp)),
                       s = exp(mean over the sequence's ratio tokens of sg(logp) - q)  low, high = 0.9997, 1.0004
  stable_reinforce     -sg(w) * exp(logp - sg(logp)) * A, w = r where low <= r <= high, else 0
                                                                                       low, high = 0.5, 2.0

Adding a loss: one function here under ``@loss(...)``; jobs and the Tinker API take it by its name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

DEFAULT_LOSS = "grpo"
"""The objective of Nova and Vertex jobs (docs/algorithm.md), unchanged when a job names no loss."""


class LossConfigError(ValueError):
    """A loss name or configuration that cannot be used; the message names the field and the value."""


@dataclass
class LossBatch:
    """What a loss reads, every tensor ``[rows, tokens]``."""

    logp: torch.Tensor  # the learner's log-probs, with gradient
    old_logp: torch.Tensor | None  # q: what the ratio is taken against (detached)
    advantages: torch.Tensor | None  # per token
    mask: torch.Tensor  # 1 where a token counts (a job's loss mask; all ones for a Tinker datum)
    extra: Mapping[str, torch.Tensor] = field(default_factory=dict)  # other inputs (weights, sequence_ratio_mask)


LossFunction = Callable[[LossBatch, Mapping[str, float]], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Loss:
    """One registered loss: its per-token function, the inputs a Tinker datum must carry (``inputs``) or may
    carry (``optional``), its settings with their defaults, and where it may be named."""

    name: str
    fn: LossFunction
    inputs: tuple[str, ...]
    defaults: Mapping[str, float]
    optional: tuple[str, ...] = ()
    jobs: bool = True  # a job may name it (algorithm.loss_fn)
    tinker: bool = True  # the Tinker API serves it
    recorded: bool = False  # q is what the server recorded at sampling time (the datum's provenance)
    check: Callable[[Mapping[str, float]], str | None] | None = None  # a problem of a resolved configuration


LOSSES: dict[str, Loss] = {}
"""Every loss by name, in registration order."""


def loss(
    name: str,
    *,
    inputs: tuple[str, ...] = ("target_tokens", "logprobs", "advantages"),
    defaults: Mapping[str, float] | None = None,
    **options,
) -> Callable[[LossFunction], LossFunction]:
    """Register the decorated per-token function as the loss ``name``."""

    def register(fn: LossFunction) -> LossFunction:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is registered twice")
        LOSSES[name] = Loss(name, fn, inputs, dict(defaults or {}), **options)
        return fn

    return register


def names(*, jobs: bool | None = None, tinker: bool | None = None) -> list[str]:
    """The registered names, optionally only those a job (``jobs=True``) or the Tinker API may name."""
    return [
        n
        for n, entry in LOSSES.items()
        if (jobs is None or entry.jobs == jobs) and (tinker is None or entry.tinker == tinker)
    ]


def get(name: str, *, where: str = "loss_fn", jobs: bool | None = None, tinker: bool | None = None) -> Loss:
    """The loss ``name``; a ``LossConfigError`` naming ``where`` and the allowed names when there is none."""
    allowed = names(jobs=jobs, tinker=tinker)
    if name not in allowed:
        raise LossConfigError(f"{where} {name!r} is not supported; supported: {', '.join(allowed)}")
    return LOSSES[name]


def resolve_config(
    name: str, config: Mapping[str, float] | None, *, where: str = "loss_fn_config", **scope: bool | None
) -> dict[str, float]:
    """The loss's settings: its defaults overridden by ``config``; unknown keys and bad values refused,
    each message naming ``where.KEY``, the value and what is allowed."""
    entry = get(name, **scope)
    resolved = dict(entry.defaults)
    for key, value in (config or {}).items():
        if key not in resolved:
            allowed = ", ".join(resolved) or "none"
            raise LossConfigError(f"{where}.{key} is not a setting of {name} (allowed: {allowed})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
            raise LossConfigError(f"{where}.{key} must be a finite number, got {value!r}")
        resolved[key] = float(value)
    problem = entry.check(resolved) if entry.check else None
    if problem:
        raise LossConfigError(f"{where}: {problem}")
    return resolved


def _thresholds(config: Mapping[str, float]) -> str | None:
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    if not 0 <= low <= high:
        return f"needs 0 <= clip_low_threshold <= clip_high_threshold, got {low:g}, {high:g}"
    return None


def _ratio(batch: LossBatch) -> torch.Tensor:
    return torch.exp(batch.logp - batch.old_logp)


def _pessimistic(
    ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``-min(ratio*A, clip(ratio, low, high)*A)`` and where the clipped term was chosen (no gradient)."""
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, low, high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def _none_clipped(batch: LossBatch) -> torch.Tensor:
    return torch.zeros_like(batch.logp, dtype=torch.bool)


# the losses ---------------------------------------------------------------------------------------


@loss(
    "grpo",
    defaults={"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "dual_clip": 0.0},
    tinker=False,
    check=lambda c: (
        None
        if 0 <= c["clip_ratio_low"] <= 1 and c["clip_ratio_high"] >= 0 and (c["dual_clip"] == 0 or c["dual_clip"] > 1)
        else "needs clip_ratio_low in [0, 1], clip_ratio_high >= 0 and dual_clip 0 (off) or above 1"
    ),
)
def grpo(batch: LossBatch, config: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The job's objective (docs/algorithm.md, "The loss"): the clipped surrogate with ``1 -/+`` clip
    ratios, and the dual clip bounding a negative advantage's loss at ``-c*A`` (``c = dual_clip``)."""
    adv = batch.advantages
    loss_, is_clipped = _pessimistic(
        _ratio(batch), adv, 1.0 - config["clip_ratio_low"], 1.0 + config["clip_ratio_high"]
    )
    if config["dual_clip"]:
        bound = -config["dual_clip"] * adv
        dual = (adv < 0) & (loss_ > bound)
        loss_ = torch.where(dual, bound, loss_)
        is_clipped = is_clipped | dual
    return loss_, is_clipped


@loss("cross_entropy", inputs=("target_tokens", "weights"), jobs=False)
def cross_entropy(batch: LossBatch, _: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    return -(batch.logp * batch.extra["weights"]), _none_clipped(batch)


@loss("importance_sampling")
def importance_sampling(batch: LossBatch, _: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    return -(_ratio(batch) * batch.advantages), _none_clipped(batch)


@loss("ppo", defaults={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, check=_thresholds)
def ppo(batch: LossBatch, config: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    return _pessimistic(_ratio(batch), batch.advantages, config["clip_low_threshold"], config["clip_high_threshold"])


@loss("cispo", defaults={"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}, check=_thresholds)
def cispo(batch: LossBatch, config: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = _ratio(batch).detach()
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    coefficient = ratio.clamp(low, high)
    return -(coefficient * batch.logp * batch.advantages), (ratio < low) | (ratio > high)


@loss(
    "dro",
    defaults={"beta": 0.1},
    check=lambda c: None if c["beta"] >= 0 else f"beta must be >= 0, got {c['beta']:g}",
)
def dro(batch: LossBatch, config: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    penalty = (batch.logp - batch.old_logp) ** 2
    return -(batch.logp * batch.advantages - 0.5 * config["beta"] * penalty), _none_clipped(batch)


def sequence_log_ratio(batch: LossBatch, members: torch.Tensor) -> torch.Tensor:
    """Each row's mean of ``sg(logp) - q`` over its ``members`` tokens ``[rows, 1]`` (0 for a row with none)."""
    members = members.to(batch.logp.dtype)
    count = members.sum(-1, keepdim=True)
    total = ((batch.logp.detach() - batch.old_logp) * members).sum(-1, keepdim=True)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


@loss(
    "gspo",
    inputs=("target_tokens", "logprobs", "advantages", "sequence_ratio_mask"),
    defaults={"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4},
    check=_thresholds,
)
def gspo(batch: LossBatch, config: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO-token (Zheng et al. 2025): every token carries its sequence's ratio ``s`` (the geometric mean of
    the token ratios over the sequence's ratio tokens) as value, and its own log-prob's gradient. The
    ratio tokens are the ``mask``'s (a job's loss mask), and of those the ``sequence_ratio_mask``'s when
    given (a Tinker datum's)."""
    members = batch.mask.bool()
    if "sequence_ratio_mask" in batch.extra:
        members = members & (batch.extra["sequence_ratio_mask"] != 0)
    log_s = sequence_log_ratio(batch, members)
    ratio = torch.exp(log_s + batch.logp - batch.logp.detach())
    return _pessimistic(ratio, batch.advantages, config["clip_low_threshold"], config["clip_high_threshold"])


@loss(
    "stable_reinforce",
    inputs=("target_tokens", "advantages"),
    optional=("logprobs",),
    defaults={"clip_low_threshold": 0.5, "clip_high_threshold": 2.0},
    check=_thresholds,
    recorded=True,
)
def stable_reinforce(batch: LossBatch, config: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE weighted by the importance ratio against the log-probs recorded when the tokens were
    sampled, a token whose ratio leaves ``[low, high]`` masked out (weight 0, no gradient): its value is
    ``-w*A`` and its gradient ``-w*A*grad logp``. OpenRFT's definition (docs/algorithm.md): Tinker
    documents what the loss needs (record_stability_info, the datum's sequence_id provenance), not its
    formula."""
    ratio = _ratio(batch).detach()
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    masked = (ratio < low) | (ratio > high)
    weight = torch.where(masked, torch.zeros_like(ratio), ratio)
    return -(weight * torch.exp(batch.logp - batch.logp.detach()) * batch.advantages), masked


def per_token(name: str, batch: LossBatch, config: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss ``name`` per token and where it clipped or masked."""
    return LOSSES[name].fn(batch, config)
