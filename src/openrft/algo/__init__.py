"""The RL math as pure functions of tensors: advantages, clipped surrogate, KL, entropy, IS weights."""

from openrft.algo.advantages import group_advantages
from openrft.algo.loss import (
    LossTerms,
    clipped_surrogate,
    entropy_from_logits,
    kl_k3,
    policy_loss_terms,
)

__all__ = [
    "LossTerms",
    "clipped_surrogate",
    "entropy_from_logits",
    "group_advantages",
    "kl_k3",
    "policy_loss_terms",
]
