"""Reward kinds: one module per kind of reward configuration, found by the registry in ``rewards/types.py``
(``kind_of``, ``build_reward``).

A kind module holds everything one kind means and nothing another kind needs. It defines:

- ``CONFIG``: the configuration class it builds (a class of ``openrft.spec.rewards``);
- ``build(config, spec, context) -> RewardFunction``: the reward function, built in one pass. Problems
  a configuration's shape cannot show (a template naming an unknown namespace, code that does not
  compile, a judge without an endpoint, a sandbox this machine cannot make) are collected as it builds,
  each named by its path under ``reward.function``, and raised together as one ``SpecError``. What it
  shares with the job's other reward functions it asks the ``RewardContext`` for (``endpoint``, ``pool``,
  ``judge``), passing the path of the field that needs it;
- ``needs(config) -> Needs``: what the reward reaches outside itself, so that the service's tenancy
  rules ask the kind instead of knowing every kind.

Adding a kind: its configuration class in ``spec/rewards.py`` (and in ``RewardConfig``), its module
here, and the dialect field that maps to it (``spec/dialects/``). Nothing else lists kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REWARD_ROOT = "reward.function"
"""Where the reward function sits in a job spec: the prefix of every problem a kind reports."""


@dataclass
class Needs:
    """What a reward configuration reaches outside itself. Paths are relative to the reward function, in
    the user's own field names (``endpoint``, ``cloudRunRewardScorer.cloudRunUri``)."""

    endpoints: list[tuple[str, str]] = field(default_factory=list)
    """(path, URL): HTTP endpoints it calls."""
    files: list[tuple[str, str]] = field(default_factory=list)
    """(path, file): files on the machine that runs it (a Lambda handler file)."""
    privileges: list[tuple[str, str, str]] = field(default_factory=list)
    """(path, value, what): what it does as the service itself: run the service's Python in-process, call
    AWS with the service's credentials."""
