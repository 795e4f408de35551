"""The demo job's parts for the component benchmarks: model, policy, learner, generator, real batches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from openrft.engine.rollouts import RolloutGroup, score_groups
from openrft.engine.setup import JobParts, build_parts
from openrft.engine.train_batch import build_train_batch
from openrft.learner import Learner, Policy, TrainSample
from openrft.rewards.runner import RewardRunner
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.types import SamplingParams
from openrft.runtime import runtime_for
from openrft.spec.dialects import load_job
from openrft.spec.job import JobSpec

RECIPE = Path(__file__).resolve().parent.parent / "examples" / "arithmetic" / "recipe.yaml"


def demo_spec(threads: int | None = None, **training) -> JobSpec:
    spec = load_job(RECIPE)
    spec.runtime.threads = threads
    spec.tracking.tensorboard = False
    for name, value in training.items():
        setattr(spec.training, name, value)
    return spec


@dataclass
class Demo:
    """The demo model as the engine builds it (LoRA policy, reference on the same weights)."""

    spec: JobSpec
    parts: JobParts
    policy: Policy
    learner: Learner
    generator: TransformersGenerator
    rewards: RewardRunner

    @classmethod
    def build(cls, spec: JobSpec) -> Demo:
        """Built the way a local job builds it (the runtime ``openrft.runtime.runtime_for`` gives a local spec), one
        learner in this process (``runtime.processes`` 1): the component benchmarks measure it."""
        spec.runtime.processes = 1
        parts = build_parts(spec)
        built = runtime_for(spec).build_learner(spec, parts)
        learner = built.learner
        return cls(spec, parts, learner.policy, learner, built.generator, RewardRunner(parts.reward))

    def params(self, n: int | None = None, max_new_tokens: int | None = None) -> SamplingParams:
        s = self.spec.sampling
        return SamplingParams(
            n=n or s.samples_per_prompt,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            max_new_tokens=max_new_tokens or self.parts.max_new_tokens,
        )

    def prompts(self, count: int, offset: int = 0) -> list[list[int]]:
        train = self.parts.train_prompts
        return [train[(offset + i) % len(train)] for i in range(count)]

    def rollout(self, prompts: int, n: int | None = None, offset: int = 0) -> list[TrainSample]:
        """One step's training samples: generated, scored by the demo reward, with group advantages."""
        indices = [(offset + i) % len(self.parts.train_prompts) for i in range(prompts)]
        examples = [self.parts.datasets.train[i] for i in indices]
        prompt_ids = [self.parts.train_prompts[i] for i in indices]
        groups = self.generator.generate(prompt_ids, self.params(n))
        outcomes = score_groups(self.rewards, examples, groups, step=0)
        scored = [RolloutGroup(e, p, g, o) for e, p, g, o in zip(examples, prompt_ids, groups, outcomes)]
        samples, _, _ = build_train_batch(scored, self.spec, self.learner.version)
        return samples

    def close(self) -> None:
        self.rewards.close()


def response_tokens(samples: list[TrainSample]) -> int:
    return sum(len(s.response_ids) for s in samples)


def sequence_tokens(samples: list[TrainSample]) -> int:
    return sum(s.length for s in samples)
