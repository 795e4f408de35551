"""The learner: LoRA policy, reference policy, LoRA+ optimizer, one training step."""

from openrft.learner.batch import TrainSample
from openrft.learner.learner import Learner, LearnerConfig
from openrft.learner.policy import Policy

__all__ = ["Learner", "LearnerConfig", "Policy", "TrainSample"]
