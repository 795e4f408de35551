"""A group of learners in processes of their own, each holding the policy: ``LearnerActor`` is one of them;
``GroupLearner`` drives them as one data-parallel learner and ``GroupGenerator`` samples a batch's prompts
on all of them at once. The same classes run as Ray actors (``ray_runtime.py``: ``rollout.runtime ray``) and as
processes of this machine (``local_parallel.py``: the engine's choice when ``runtime.threads`` is unset).
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from openrft.engine.local_runtime import learner_config, replica_seed
from openrft.learner.learner import SUM_KEYS, add_sums, mini_batches, response_tokens, step_metrics, trained
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams
from openrft.runtime.process_group import all_reduce_gradients, free_port, join_process_group, node_address
from openrft.runtime.ray_faults import get_naming_the_lost
from openrft.spec.job import JobSpec


def load_model(spec: JobSpec):
    from openrft.models import configure_threads, eos_token_ids, load_causal_lm, load_tokenizer, pick_device, pick_dtype

    configure_threads(spec.runtime.threads or 1)
    device = pick_device(spec.runtime.device)
    tokenizer = load_tokenizer(spec.model.name_or_path, spec.model.revision)
    torch.manual_seed(spec.training.seed)  # as the local runtime: the same adapter initialisation
    model = load_causal_lm(spec.model.name_or_path, device, pick_dtype(spec.model.dtype, device), spec.model.revision)
    return model, tokenizer, eos_token_ids(tokenizer, model)


class LearnerActor:
    """Policy, learner and a generator on one actor (``index`` picks its sampling stream)."""

    def __init__(self, spec_json: str, index: int = 0, sharers: int | None = None):
        from openrft.learner import Learner, Policy
        from openrft.rollout.local import TransformersGenerator

        spec = JobSpec.model_validate_json(spec_json)
        model, tokenizer, eos = load_model(spec)
        self.policy = Policy(model, spec.lora, need_reference=spec.algorithm.kl_loss_coef > 0)
        # data-parallel learners on CPUs may share one machine's memory: each sizes its micro-batches for its part
        on_cpu = model.device.type == "cpu"
        sharers = (sharers or spec.rollout.replicas) if on_cpu else 1
        self.learner = Learner(self.policy, learner_config(spec, tokenizer.pad_token_id), memory_sharers=sharers)
        seed = replica_seed(spec.training.seed, index)  # learners sampling shares of a batch draw independently
        self.generator = TransformersGenerator(self.policy.model, tokenizer, eos, tokenizer.pad_token_id, seed=seed)

    @classmethod
    def around(cls, policy, learner, generator) -> LearnerActor:
        """This process's own policy, learner and generator as the group's first member (``local_parallel``)."""
        actor = cls.__new__(cls)
        actor.policy, actor.learner, actor.generator = policy, learner, generator
        return actor

    def version(self) -> int:
        return self.learner.version

    def use_kl(self) -> bool:
        return self.learner.use_kl

    def ppo_mini_batches(self) -> int:
        return self.learner.config.algorithm.ppo_mini_batches

    def pid(self) -> int:
        return os.getpid()

    def step(self, samples: list) -> tuple[dict[str, float], int]:
        metrics = self.learner.step(samples)
        self.generator.set_policy_version(self.learner.version)
        return metrics, self.learner.version

    def rendezvous(self) -> tuple[str, int]:
        """Where the first learner listens for the data-parallel process group: its node's address, a free port."""
        return node_address(), free_port()

    def join(self, rank: int, world_size: int, address: str, port: int) -> None:
        join_process_group(rank, world_size, address, port, self.learner.device)

    def train(self, shares: list[list], tokens: list[int]) -> tuple[dict[str, float], list[float], list, float, int]:
        """Data-parallel: a step on this learner's share of each mini-batch (``tokens``: each mini-batch's trained
        tokens over all learners). Before each update the learners sum their gradients among themselves
        (``all_reduce_gradients``), so every one applies the same update and they stay equal. Returns the loss sums
        of its shares, the updates' gradient norms, the old log-probs it recorded for the later mini-batches' samples
        (None for a stale one), the learning rate and the version."""
        later = [s for share in shares[1:] for s in share]
        self.learner.record_old_logp(later)  # the policy before the first update, for this learner's shares
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        norms = []
        for share, total in zip(shares, tokens, strict=True):
            if share:
                add_sums(sums, self.learner.accumulate(share, total))
            all_reduce_gradients(self.policy.trainable_parameters())
            norms.append(self.learner.apply_update())
        lr, version = self.end_step()
        return sums, norms, [s.old_logp for s in later], lr, version

    def old_logp(self, samples: list) -> list[list[float]]:
        """The current policy's log-probs of ``samples``, as recorded before a step's first update."""
        self.learner.record_old_logp(samples)
        return [s.old_logp for s in samples]

    def end_step(self) -> tuple[float, int]:
        self.learner.end_step()
        self.generator.set_policy_version(self.learner.version)
        return self.learner.optimizer.param_groups[0]["lr"], self.learner.version

    def state_dict(self) -> dict:
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> int:
        self.learner.load_state_dict(state)
        self.generator.set_policy_version(self.learner.version)
        return self.learner.version

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return self.policy.adapter_state()

    def probe_scores(self, probe) -> list[list[float]]:
        """The sync probe's continuation log-probs under the current policy (``rollout/sync_probe.py``)."""
        from openrft.rollout.sync_probe import score_with_model

        return score_with_model(self.policy.model, probe)

    def adapter_files(self) -> dict[str, bytes]:
        from openrft.engine.checkpoints import save_adapter

        with tempfile.TemporaryDirectory() as tmp:
            save_adapter(self.policy.model, Path(tmp))
            return {str(p.relative_to(tmp)): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None) -> list[list[Completion]]:
        return self.generator.generate(prompts, params, seed=seed)


def contiguous_shares(items: list, count: int) -> list[list]:
    """``items`` cut into ``count`` contiguous shares, one per learner, in order (the last ones may be empty)."""
    size = math.ceil(len(items) / count)
    return [items[i * size : (i + 1) * size] for i in range(count)]


class GroupLearner:
    """The learner as the loop sees it (``step``, ``version``, state), running on ``LearnerActor``s.

    With several actors the learners are data-parallel: each computes the gradient of its share of the
    batch (normalised by the global batch's tokens), they sum them, and every learner applies the same
    sum, so all of them hold the same weights; the first one serves evaluation, checkpoints and the
    adapter for the generators. ``system`` runs the actors' calls: Ray (the default), or this machine's
    processes (``local_processes.LOCAL``).
    """

    def __init__(self, actors: list, system: Any = None):
        if system is None:
            import ray as system

        self.actors, self._ray = actors, system
        self.actor = actors[0]
        self.version, self.use_kl, self.algorithm_mini_batches = system.get(
            [self.actor.version.remote(), self.actor.use_kl.remote(), self.actor.ppo_mini_batches.remote()]
        )
        if len(actors) > 1:  # data-parallel: the learners sum their gradients in a process group of their own
            address, port = system.get(self.actor.rendezvous.remote())
            system.get([a.join.remote(rank, len(actors), address, port) for rank, a in enumerate(actors)])

    def step(self, samples: list) -> dict[str, float]:
        if len(self.actors) == 1:
            metrics, self.version = self._ray.get(self.actor.step.remote(samples))
            return metrics
        total_tokens = response_tokens(samples)
        minis = [m for m in mini_batches(samples, self.algorithm_mini_batches) if trained(m)]
        tokens = [response_tokens(mini) for mini in minis]
        by_learner = [list(shares) for shares in zip(*(self._shares(mini) for mini in minis), strict=True)]
        refs = [a.train.remote(shares, tokens) for a, shares in zip(self.actors, by_learner)]
        results = get_naming_the_lost(self._ray, refs)  # a lost peer, not the survivors' broken collective
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        for shares, (learner_sums, _, old_logps, _, _) in zip(by_learner, results, strict=True):
            add_sums(sums, learner_sums)
            later = [s for share in shares[1:] for s in share]
            for sample, logp in zip(later, old_logps, strict=True):
                if sample.behaviour_logp is None:  # the anchor the ratio of a later mini-batch was taken against
                    sample.old_logp = logp
        _, norms, _, lr, self.version = results[0]
        return step_metrics(sums, total_tokens, sum(norms) / len(norms), lr, self.use_kl, len(minis))

    def _shares(self, samples: list) -> list[list]:
        return contiguous_shares(samples, len(self.actors))

    def state_dict(self) -> dict:
        return self._ray.get(self.actor.state_dict.remote())

    def load_state_dict(self, state: dict) -> None:
        ref = self._ray.put(state)
        self.version = self._ray.get([a.load_state_dict.remote(ref) for a in self.actors])[0]


class GroupGenerator(PolicyVersioned):
    """Sampling on the learner actors, which hold the current policy (no weights to send).

    Training rollouts (no ``seed``) are cut into one contiguous share of prompts per learner, sampled at
    the same time, each learner from its own random stream: with several data-parallel learners on a
    small model that is what uses every core. Evaluation (always with a seed) runs on the first learner,
    so its figures do not depend on how many learners there are. ``rng`` only keeps the checkpoint format.
    """

    def __init__(self, actors: list, system: Any = None):
        if system is None:
            import ray as system

        self.actors, self._ray = actors, system
        self.rng = torch.Generator()

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None):
        ray = self._ray
        if seed is not None or len(self.actors) == 1:
            return ray.get(self.actors[0].generate.remote(prompts, params, seed))
        shares = [(a, share) for a, share in zip(self.actors, contiguous_shares(prompts, len(self.actors))) if share]
        parts = ray.get([actor.generate.remote(share, params, None) for actor, share in shares])
        return [group for part in parts for group in part]
