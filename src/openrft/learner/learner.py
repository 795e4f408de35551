"""One optimizer step of the GRPO-family objective over a global batch, in micro-batches."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from openrft.algo.loss import entropy_from_logits, policy_loss_terms, truncated_importance_weight
from openrft.learner.batch import MicroBatch, TrainSample, collate, plan_micro_batches
from openrft.learner.checkpointing import enable_activation_checkpointing
from openrft.learner.logprobs import can_chunk, chunk_tokens, chunked_logp_entropy, shared_prefix_forward, unwrap
from openrft.learner.optimizer import build_optimizer, build_scheduler
from openrft.learner.policy import Policy
from openrft.spec.job import AlgorithmSpec, LoraSpec, OptimizerSpec


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


def response_logits(model: torch.nn.Module, mb: MicroBatch, temperature: float) -> torch.Tensor:
    """Temperature-scaled logits ``[rows, response_width, vocab]`` predicting ``mb.response_ids``, from the
    shared-prefix passes (``shared_prefix_forward``)."""
    logits = shared_prefix_forward(model, mb).float()
    return logits / temperature if temperature > 0 else logits


def token_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


SUM_KEYS = ("pg_loss", "clipped", "kl", "entropy", "is_weight", "mismatch_kl", "off_policy")


def response_tokens(samples: list[TrainSample]) -> int:
    total = sum(s.trained_tokens for s in samples)
    if total == 0:
        raise ValueError("a training batch needs at least one trained response token")
    return total


def step_metrics(sums: dict[str, float], total_tokens: int, grad_norm: float, lr: float, kl: bool) -> dict[str, float]:
    """One update's metrics from the loss sums of its samples (summed over data-parallel learners too)."""
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
    if sums["off_policy"]:
        metrics["actor/importance_weight_mean"] = sums["is_weight"] / total_tokens
        metrics["rollout/mismatch_kl"] = sums["mismatch_kl"] / total_tokens
    return metrics


class Learner:
    """Owns the policy's optimizer and the policy version (the number of updates so far)."""

    def __init__(self, policy: Policy, config: LearnerConfig):
        self.policy = policy
        self.config = config
        self.model = policy.model
        self.device = next(self.model.parameters()).device
        if config.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        self.optimizer = build_optimizer(self.model, config.optimizer, config.lora)
        self.scheduler = build_scheduler(self.optimizer, config.optimizer.warmup_steps)
        self.version = 0

    @property
    def use_kl(self) -> bool:
        return self.config.algorithm.kl_loss_coef > 0

    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        """Accumulate the gradient of every micro-batch, then take one optimizer step."""
        total_tokens = response_tokens(samples)
        sums = self.accumulate(samples, total_tokens)
        grad_norm = self.apply_update()
        return step_metrics(sums, total_tokens, grad_norm, self.optimizer.param_groups[0]["lr"], self.use_kl)

    def accumulate(self, samples: list[TrainSample], total_tokens: int) -> dict[str, float]:
        """Add the gradient of ``samples`` to the parameters' ``.grad``; the loss sums of its metrics.

        Token-level aggregation: each micro-batch's token sum is divided by ``total_tokens``, the trained
        response tokens (``loss_mask``) of the whole global batch, so the result does not depend on how the
        batch was split, into micro-batches here or across data-parallel learners.
        """
        algo = self.config.algorithm
        if not self.model.training:  # train() walks every module: skip it when nothing changes
            self.model.train()
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        for indices in self.plan(samples):
            mb = collate([samples[i] for i in indices], self.config.pad_token_id, self.device)
            ref_logp = self._reference_logp(mb) if self.use_kl else None
            logp, entropy = self.log_probs(self.model, mb, entropy_grad=algo.ent_coeff > 0)
            proximal = self.proximal_logp(mb, logp)
            weight = None
            if mb.behaviour_logp is not None:
                weight = truncated_importance_weight(proximal, mb.behaviour_logp, self.config.importance_weight_cap)
                delta = mb.behaviour_logp - proximal
                sums["mismatch_kl"] += ((delta.exp() - delta - 1) * mb.loss_mask).sum().item()
                sums["off_policy"] = 1.0
            terms = policy_loss_terms(
                logp,
                proximal,
                mb.advantages,
                mb.loss_mask,
                clip_low=algo.clip_ratio_low,
                clip_high=algo.clip_ratio_high,
                ref_logp=ref_logp,
                kl_coef=algo.kl_loss_coef,
                entropy=entropy if algo.ent_coeff > 0 else None,
                ent_coeff=algo.ent_coeff,
                importance_weight=weight,
                loss_scale=algo.loss_scale,
            )
            (terms.loss / total_tokens).backward()
            sums["pg_loss"] += terms.pg_loss
            sums["clipped"] += terms.clipped_tokens
            sums["kl"] += terms.kl
            sums["entropy"] += (entropy.detach() * mb.loss_mask).sum().item()
            sums["is_weight"] += terms.importance_weight
        return sums

    def apply_update(self) -> float:
        """Clip the accumulated gradient, step, and count the update; the gradient norm before clipping."""
        grad_norm = self._clip_and_step()
        self.version += 1
        if self.config.algorithm.refit_freq and self.version % self.config.algorithm.refit_freq == 0:
            self.policy.refit_reference()
        return grad_norm

    def gradients(self) -> list[torch.Tensor]:
        """The accumulated gradient of each trainable parameter (zeros where none flowed)."""
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.policy.trainable_parameters()]

    def set_gradients(self, grads: list[torch.Tensor]) -> None:
        """Use ``grads`` as the accumulated gradient; copied, since clipping scales ``.grad`` in place."""
        for param, grad in zip(self.policy.trainable_parameters(), grads, strict=True):
            param.grad = grad.to(param.device, param.dtype, copy=True)

    def plan(self, samples: list[TrainSample]) -> list[list[int]]:
        """Shared-prefix micro-batches sorted and sized by padded tokens (``plan_micro_batches``)."""
        return plan_micro_batches(samples, self.config.micro_batch_tokens)

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
            logp, ent = chunked_logp_entropy(model, mb, self.config.temperature, chunk)
            return logp, (ent if entropy_grad else ent.detach()) if entropy else None
        logits = self.logits(model, mb)
        if not entropy:
            return token_logp(logits, mb.targets), None
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = entropy_from_logits(logits)
        return token_logp(logits, mb.targets), ent

    def head_chunk(self, model: torch.nn.Module, mb: MicroBatch) -> int | None:
        """Tokens per LM-head chunk for ``mb``, or None when its full fp32 logits fit ``logits_chunk_bytes``."""
        if not can_chunk(model):
            return None
        chunk = chunk_tokens(unwrap(model).get_output_embeddings().weight.shape[0], self.config.logits_chunk_bytes)
        return chunk if mb.response_ids.numel() > chunk else None

    def proximal_logp(self, mb: MicroBatch, logp: torch.Tensor) -> torch.Tensor:
        """The policy before this update. It is the one being trained, so its log-probs are this
        forward's own, detached: the ratio is 1 and no second forward pass is needed."""
        return logp.detach()

    @torch.no_grad()
    def _reference_logp(self, mb: MicroBatch) -> torch.Tensor:
        with self.policy.reference_forward() as reference:
            return self.log_probs(reference, mb, entropy=False)[0]

    def _clip_and_step(self) -> float:
        params = self.policy.trainable_parameters()
        max_norm = self.config.optimizer.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # checkpoint state ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "version": self.version,
            "adapter": self.policy.adapter_state(),
            "reference": self.policy.reference_state(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.version = int(state["version"])
        self.policy.load_adapter_state(state["adapter"])
        self.policy.load_reference_state(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
