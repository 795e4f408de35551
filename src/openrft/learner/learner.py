"""One optimizer step of the GRPO-family objective over a global batch, in micro-batches."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from openrft.algo.loss import entropy_from_logits, kl_k3, policy_loss_terms
from openrft.algo.losses import DEFAULT_LOSS, resolve_config
from openrft.algo.rollout_correction import (
    CORRECTION_SUM_KEYS,
    correction_metrics,
    correction_sums,
    correction_weights,
    support_log_probs,
    truncates,
)
from openrft.errors import OpenRFTError
from openrft.learner.activation_memory import activation_bytes_per_token, available_bytes, micro_batch_cap
from openrft.learner.batch import MicroBatch, TrainSample, collate, plan_micro_batches
from openrft.learner.checkpointing import enable_activation_checkpointing
from openrft.learner.logprobs import can_chunk, chunk_tokens, chunked_logp_entropy, shared_prefix_forward, unwrap
from openrft.learner.onednn import frozen_linears
from openrft.learner.optimizer import build_optimizer, build_scheduler
from openrft.learner.policy import Policy
from openrft.module_mode import set_training
from openrft.spec.job import AlgorithmSpec, LoraSpec, OptimizerSpec, RolloutCorrectionSpec


@dataclass
class LearnerConfig:
    algorithm: AlgorithmSpec
    optimizer: OptimizerSpec
    lora: LoraSpec
    temperature: float
    micro_batch_tokens: int
    pad_token_id: int
    importance_weight_cap: float = 2.0
    # Above this many bytes of fp32 response logits, log-probs and entropy come from the LM head run over
    # chunks of this size (learner/logprobs.py); below it, from the full logits.
    logits_chunk_bytes: int = 64 * 2**20
    activation_checkpointing: bool = False  # decoder layers recomputed in backward (learner/checkpointing.py)
    # the sampler's truncation (the support of an engine's processed log-probs) and the rollout correction
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    correction: RolloutCorrectionSpec | None = None  # mode already resolved (not "auto"); None = off


# The lowest support log-prob used in a ratio: a token outside the learner's truncated support has ratio ~0
# (exp(-30)), finite so that its loss and statistics stay finite.
SUPPORT_LOGP_FLOOR = -30.0


def response_logits(model: torch.nn.Module, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """Temperature-scaled logits ``[rows, response_width, vocab]`` predicting ``mb.response_ids``, from the
    shared-prefix passes (``shared_prefix_forward``)."""
    logits = shared_prefix_forward(model, mb).float()
    return logits / temperature if temperature > 0 else logits


def token_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


SUM_KEYS = ("pg_loss", "clipped", "kl", "entropy", "is_weight", "mismatch_kl", "stale_tokens", *CORRECTION_SUM_KEYS)


def response_tokens(samples: list[TrainSample]) -> int:
    total = sum(s.trained_tokens for s in samples)
    if total == 0:
        raise ValueError("a training batch needs at least one trained response token")
    return total


def trained(samples: list[TrainSample]) -> int:
    """Response tokens of ``samples`` that carry loss (their loss masks' ones)."""
    return sum(s.trained_tokens for s in samples)


def mini_batches(samples: list[TrainSample], count: int) -> list[list[TrainSample]]:
    """``samples`` in ``count`` mini-batches of whole groups (samples of one prompt), in order, as even as
    the groups allow (verl's ``ppo_mini_batch_size`` split); fewer when there are fewer groups."""
    groups: dict[tuple[int, ...], list[TrainSample]] = {}
    for sample in samples:
        groups.setdefault(tuple(sample.prompt_ids), []).append(sample)
    members = list(groups.values())
    count = max(1, min(count, len(members)))
    out: list[list[TrainSample]] = [[] for _ in range(count)]
    for index, group in enumerate(members):
        out[index * count // len(members)].extend(group)
    return [m for m in out if m]


def add_sums(total: dict[str, float], part: dict[str, float]) -> None:
    for key in SUM_KEYS:
        total[key] += part[key]


def step_metrics(
    sums: dict[str, float], total_tokens: int, grad_norm: float, lr: float, kl: bool, updates: int = 1
) -> dict[str, float]:
    """One step's metrics from the loss sums of its samples (summed over mini-batches and data-parallel
    learners too); ``grad_norm`` is the mean over the step's ``updates``."""
    metrics = {
        "actor/pg_loss": sums["pg_loss"] / total_tokens,
        "actor/pg_clipfrac": sums["clipped"] / total_tokens,
        "actor/entropy": sums["entropy"] / total_tokens,
        "actor/grad_norm": grad_norm,
        "actor/lr": lr,
        "actor/trained_tokens": float(total_tokens),
    }
    if kl:
        metrics["actor/kl"] = sums["kl"] / total_tokens
    if updates > 1:
        metrics["actor/updates"] = float(updates)
    if sums["stale_tokens"]:  # over the tokens of stale samples only: fresh ones have none to report
        metrics["actor/importance_weight_mean"] = sums["is_weight"] / sums["stale_tokens"]
        metrics["rollout/mismatch_kl"] = sums["mismatch_kl"] / sums["stale_tokens"]
    if sums["rc_tokens"] or sums["rc_missing"]:  # fresh samples from an engine, with the rollout correction on
        metrics.update(correction_metrics(sums, sums["rc_tokens"] + sums["rc_missing"]))
    return metrics


class Learner:
    """Owns the policy's optimizer and the policy version (the number of updates so far)."""

    def __init__(self, policy: Policy, config: LearnerConfig, memory_sharers: int = 1):
        self.policy = policy
        self.config = config
        self.model = policy.model
        self.device = next(self.model.parameters()).device
        if config.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        algorithm = config.algorithm
        self.loss_fn = algorithm.loss_fn
        self.loss_config = (
            None
            if self.loss_fn == DEFAULT_LOSS
            else resolve_config(self.loss_fn, algorithm.loss_fn_config, where="algorithm.loss_fn_config", jobs=True)
        )
        self.optimizer = build_optimizer(self.model, config.optimizer, config.lora)
        self.scheduler = build_scheduler(self.optimizer, config.optimizer.warmup_steps)
        self.version = 0
        dtype = next(self.model.parameters()).dtype
        self.activation_bytes_per_token = activation_bytes_per_token(
            self.model.config, dtype.itemsize, config.activation_checkpointing
        )
        # micro-batches never hold more tokens than fit in memory (activation_memory.py)
        self.micro_batch_cap = micro_batch_cap(
            self.activation_bytes_per_token, available_bytes(self.device), memory_sharers
        )

    @property
    def use_kl(self) -> bool:
        return self.config.algorithm.kl_loss_coef > 0

    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One training step: an optimizer update per mini-batch (``algorithm.ppo_mini_batches``, one by
        default), each accumulating the gradient of its micro-batches; then the policy version moves on."""
        total_tokens = response_tokens(samples)
        minis = [m for m in mini_batches(samples, self.config.algorithm.ppo_mini_batches) if trained(m)]
        self.record_old_logp([s for mini in minis[1:] for s in mini])
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        norms = []
        for mini in minis:
            add_sums(sums, self.accumulate(mini, response_tokens(mini)))
            norms.append(self.apply_update())
        self.end_step()
        lr = self.optimizer.param_groups[0]["lr"]
        return step_metrics(sums, total_tokens, sum(norms) / len(norms), lr, self.use_kl, len(minis))

    @torch.no_grad()
    def record_old_logp(self, samples: list[TrainSample]) -> None:
        """Before the step's first update: set ``old_logp`` of the fresh ``samples`` (those of later
        mini-batches) to the current policy's log-probs, computed once (TRL's ``old_per_token_logps``,
        verl's ``old_log_prob``). Stale samples keep their behaviour log-probs as anchor."""
        fresh = [s for s in samples if s.behaviour_logp is None]
        if not fresh:
            return
        if not self.model.training:
            set_training(self.model, True)  # the mode the update's forward runs in (dropout and all)
        with self.frozen_on_onednn(fresh):
            for indices in self.plan(fresh):
                chunk = [fresh[i] for i in indices]
                for sample in chunk:
                    sample.old_logp = None
                mb = collate(chunk, self.config.pad_token_id, self.device)
                logp, _, support = self.log_probs_on_support(self.model, mb, entropy=False)
                for row, sample in enumerate(chunk):
                    sample.old_logp = logp[row, : len(sample.response_ids)].tolist()
                    if support is not None and sample.engine_truncated:
                        sample.old_support_logp = support[row, : len(sample.response_ids)].tolist()

    def accumulate(self, samples: list[TrainSample], total_tokens: int) -> dict[str, float]:
        """Add the gradient of ``samples`` to the parameters' ``.grad``; the loss sums of its metrics.

        Token-level aggregation: each micro-batch's token sum is divided by ``total_tokens``, the trained
        response tokens (``loss_mask``) of the whole global batch, so the result does not depend on how the
        batch was split, into micro-batches here or across data-parallel learners.
        """
        algo = self.config.algorithm
        if not self.model.training:  # a walk of every module: skipped when nothing changes
            set_training(self.model, True)
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        with self.frozen_on_onednn(samples):
            for indices in self.plan(samples):
                mb = collate([samples[i] for i in indices], self.config.pad_token_id, self.device)
                ref_logp = self._reference_logp(mb) if self.use_kl else None
                logp, entropy, support = self.log_probs_on_support(self.model, mb, entropy_grad=algo.ent_coeff > 0)
                weights = None
                if mb.engine_logp is not None and self.config.correction is not None:
                    weights = self.correction(mb, logp, support, sums)
                if support is not None and mb.stale is not None:  # a stale row's ratio on its engine's support
                    logp = torch.where((mb.stale & mb.engine_truncated).unsqueeze(-1), support, logp)
                old_logp = self.old_logp(mb, logp)
                if mb.stale is not None:  # stale rows: how far the policy moved from the one that sampled them
                    stale = mb.loss_mask * mb.stale.unsqueeze(-1)
                    sums["is_weight"] += (torch.exp(logp.detach() - old_logp) * stale).sum().item()
                    sums["mismatch_kl"] += (kl_k3(logp.detach(), old_logp) * stale).sum().item()
                    sums["stale_tokens"] += stale.sum().item()
                terms = policy_loss_terms(
                    logp,
                    old_logp,
                    mb.advantages,
                    mb.loss_mask,
                    clip_low=algo.clip_ratio_low,
                    clip_high=algo.clip_ratio_high,
                    dual_clip=self.config.importance_weight_cap,
                    ref_logp=ref_logp,
                    kl_coef=algo.kl_loss_coef,
                    entropy=entropy if algo.ent_coeff > 0 else None,
                    ent_coeff=algo.ent_coeff,
                    loss_scale=algo.loss_scale,
                    token_weights=weights,
                    loss_fn=self.loss_fn,
                    loss_config=self.loss_config,
                )
                self.backward(terms.loss / total_tokens)
                sums["pg_loss"] += terms.pg_loss
                sums["clipped"] += terms.clipped_tokens
                sums["kl"] += terms.kl
                sums["entropy"] += (entropy.detach() * mb.loss_mask).sum().item()
        return sums

    def frozen_on_onednn(self, samples: list[TrainSample]) -> AbstractContextManager[int]:
        """The frozen base weights packed for oneDNN while ``samples`` pass (``learner/onednn.py``)."""
        micro_batch = min(self.config.micro_batch_tokens, self.micro_batch_cap)
        return frozen_linears(self.model, trained(samples), micro_batch * self.activation_bytes_per_token)

    def backward(self, loss: torch.Tensor) -> None:
        """One pass's backward, adding into the accumulated gradient."""
        loss.backward()

    def apply_update(self) -> float:
        """Clip the accumulated gradient and take an optimizer step; the gradient norm before clipping."""
        params = self.policy.trainable_parameters()
        max_norm = self.config.optimizer.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # sharded: the global norm

    def end_step(self) -> None:
        """After a step's updates: the learning-rate schedule and the policy version (the number of steps)
        move on, and every ``refit_freq`` steps the reference becomes a copy of the policy."""
        self.scheduler.step()
        self.version += 1
        if self.config.algorithm.refit_freq and self.version % self.config.algorithm.refit_freq == 0:
            self.policy.refit_reference()

    def gradients(self) -> list[torch.Tensor]:
        """The accumulated gradient of each trainable parameter (zeros where none flowed)."""
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.policy.trainable_parameters()]

    def plan(self, samples: list[TrainSample]) -> list[list[int]]:
        """Shared-prefix micro-batches sorted and sized by padded tokens (``plan_micro_batches``)."""
        return plan_micro_batches(samples, min(self.config.micro_batch_tokens, self.micro_batch_cap))

    def logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Temperature-scaled response logits of ``model`` (the policy, or the reference)."""
        return response_logits(model, mb, self.config.temperature)

    def log_probs(
        self, model: torch.nn.Module, mb: MicroBatch, entropy: bool = True, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of ``mb.targets`` and (if ``entropy``) entropies ``[rows, response_width]`` under ``model``:
        from the full logits when they fit ``logits_chunk_bytes``, otherwise chunked over tokens."""
        chunk = self.head_chunk(model, mb)
        if chunk is not None:
            temperature = self.config.temperature
            logp, ent = chunked_logp_entropy(model, mb, temperature, chunk, entropy, entropy_grad)
            return logp, (ent if entropy_grad else ent.detach()) if entropy else None
        logits = self.logits(model, mb)
        if not entropy:
            return token_logp(logits, mb.targets), None
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = entropy_from_logits(logits)
        return token_logp(logits, mb.targets), ent

    def log_probs_on_support(
        self, model: torch.nn.Module, mb: MicroBatch, entropy: bool = True, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``log_probs`` and, when some row's engine reported truncated log-probs (top-k / top-p / min-p on),
        the log-probs on the truncated, renormalised support (``support_log_probs``, floored at
        ``SUPPORT_LOGP_FLOOR``; with gradient), else None."""
        cfg = self.config
        if (
            mb.engine_truncated is None
            or not bool(mb.engine_truncated.any())
            or not truncates(cfg.top_k, cfg.top_p, cfg.min_p)
        ):
            return (*self.log_probs(model, mb, entropy, entropy_grad), None)
        if not self.full_logits_fit(model, mb):
            raise OpenRFTError(
                "truncated engine log-probs (sampling.top_k / top_p / min_p with a vLLM server in processed "
                "mode) need the full logits, but this micro-batch's logits exceed the chunking threshold: "
                "lower training.micro_batch_tokens, or turn top-k / top-p / min-p off"
            )
        logits = self.logits(model, mb)
        support = support_log_probs(logits, mb.targets, cfg.top_k, cfg.top_p, cfg.min_p).clamp(min=SUPPORT_LOGP_FLOOR)
        logp = token_logp(logits, mb.targets)
        if not entropy:
            return logp, None, support
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = entropy_from_logits(logits)
        return logp, ent, support

    def correction(
        self, mb: MicroBatch, logp: torch.Tensor, support: torch.Tensor | None, sums: dict[str, float]
    ) -> torch.Tensor:
        """Rollout-correction weights ``[rows, tokens]`` (1 on rows without engine log-probs): the learner's
        log-probs before the update (on the engine's support) against the engine's; adds the mismatch sums."""
        spec = self.config.correction
        trainer = logp.detach()
        if support is not None:
            trainer = torch.where(mb.engine_truncated.unsqueeze(-1), support.detach(), trainer)
        if mb.old_logp is not None:  # later mini-batches: the log-probs recorded before the first update
            trainer = torch.where(mb.anchored.unsqueeze(-1), mb.old_logp, trainer)
        if mb.old_support_logp is not None:
            recorded = mb.anchored & mb.engine_truncated
            trainer = torch.where(recorded.unsqueeze(-1), mb.old_support_logp, trainer)
        rows = mb.engine_rows.unsqueeze(-1)
        result = correction_weights(
            trainer, mb.engine_logp, mb.loss_mask * rows, mode=spec.mode, level=spec.level, cap=spec.cap
        )
        for key, value in correction_sums(result).items():
            sums[key] += value
        return torch.where(rows, result.weights, torch.ones_like(result.weights))

    def head_chunk(self, model: torch.nn.Module, mb: MicroBatch) -> int | None:
        """Tokens per LM-head chunk for ``mb``, or None when its full fp32 logits fit ``logits_chunk_bytes``."""
        return None if self.full_logits_fit(model, mb) else self.chunk_size(model)

    def full_logits_fit(self, model: torch.nn.Module, mb: MicroBatch) -> bool:
        """Whether ``mb``'s full fp32 logits fit ``logits_chunk_bytes`` (always, for a head that cannot be chunked)."""
        return not can_chunk(model) or mb.response_ids.numel() <= self.chunk_size(model)

    def chunk_size(self, model: torch.nn.Module) -> int:
        """Tokens per LM-head chunk: one chunk's fp32 logits take about ``logits_chunk_bytes``."""
        return chunk_tokens(unwrap(model).get_output_embeddings().weight.shape[0], self.config.logits_chunk_bytes)

    def old_logp(self, mb: MicroBatch, logp: torch.Tensor) -> torch.Tensor:
        """What the ratio is taken against, per row: the recorded anchor (behaviour log-probs of a stale
        sample, or the log-probs before the step's first update), else ``proximal_logp``."""
        proximal = self.proximal_logp(mb, logp)
        if mb.old_logp is None:
            return proximal
        return torch.where(mb.anchored.unsqueeze(-1), mb.old_logp, proximal)

    def proximal_logp(self, mb: MicroBatch, logp: torch.Tensor) -> torch.Tensor:
        """The policy before this step's first update, for rows of the first mini-batch: the one being
        trained, so its log-probs are this forward's own, detached (ratio 1, no second forward pass)."""
        return logp.detach()

    @torch.no_grad()
    def _reference_logp(self, mb: MicroBatch) -> torch.Tensor:
        with self.policy.reference_forward() as reference:
            return self.log_probs(reference, mb, entropy=False)[0]

    # checkpoint state ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "version": self.version,
            "adapter": self.policy.adapter_state(),
            "reference": self.policy.reference_state(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def snapshot(self) -> dict:
        """What a step changes, copied, for ``restore`` to put back: the trainable parameters, the optimizer's and
        the schedule's state, the version, and the reference where the step refits it. Cheaper than ``state_dict``
        (tensors cloned, no names, no PEFT state-dict walk): its time is ``perf/learner_snapshot_s``."""
        refit = self.config.algorithm.refit_freq
        refits = bool(refit) and (self.version + 1) % refit == 0
        return {
            "version": self.version,
            "parameters": [p.detach().clone() for p in self.policy.trainable_parameters()],
            "optimizer": {
                p: {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
                for p, state in self.optimizer.state.items()
            },
            "scheduler": self.scheduler.state_dict(),
            "reference": (self.policy.reference_state(),) if refits else None,
        }

    @torch.no_grad()
    def restore(self, snapshot: dict) -> None:
        """Back to ``snapshot``'s state, the gradient summed since then dropped."""
        self.version = snapshot["version"]
        for parameter, saved in zip(self.policy.trainable_parameters(), snapshot["parameters"], strict=True):
            parameter.copy_(saved)
        self.optimizer.state.clear()
        self.optimizer.state.update(snapshot["optimizer"])
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.load_state_dict(snapshot["scheduler"])
        if snapshot["reference"] is not None:
            self.policy.load_reference_state(snapshot["reference"][0])

    def load_state_dict(self, state: dict) -> None:
        self.version = int(state["version"])
        self.policy.load_adapter_state(state["adapter"])
        self.policy.load_reference_state(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
