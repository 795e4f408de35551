"""RewardSpec -> a RewardFunction: the config's class names its kind (``rewards/kinds/``), the kind builds it.

Every module of ``rewards/kinds`` is a kind; its ``CONFIG`` class is its key. Building checks what
pydantic could not (``SpecError`` naming each problem's path) before the job starts.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType

from openrft.errors import RewardError
from openrft.rewards import kinds
from openrft.rewards.context import RewardContext
from openrft.rewards.kinds import Needs
from openrft.rewards.types import RewardFunction, RewardOutcome, RewardSample
from openrft.spec.rewards import RewardConfig, RewardSpec


@functools.cache
def _kinds() -> dict[type, ModuleType]:
    found: dict[type, ModuleType] = {}
    for info in pkgutil.iter_modules(kinds.__path__):
        module = importlib.import_module(f"{kinds.__name__}.{info.name}")
        found[module.CONFIG] = module
    return found


def kind_of(config: RewardConfig) -> ModuleType:
    """The kind module that builds ``config``."""
    try:
        return _kinds()[type(config)]
    except KeyError:
        raise RewardError(f"reward type {config.type!r} is not available in this build") from None


def needs_of(config: RewardConfig) -> Needs:
    """The endpoints, files and privileges ``config`` needs (the service's tenancy rules read them)."""
    return kind_of(config).needs(config)


class ManagedReward:
    """The job's reward function together with what its parts share; closing it closes them."""

    def __init__(self, function: RewardFunction, context: RewardContext):
        self.function = function
        self.context = context
        self.name = function.name
        self.requires_reference = function.requires_reference

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        return await self.function.score(samples)

    async def aclose(self) -> None:
        try:
            await self.function.aclose()
        finally:
            await self.context.aclose()


def build_reward(spec: RewardSpec) -> ManagedReward:
    """The reward function of ``spec``, built by its kind; a ``SpecError`` lists every problem it found."""
    context = RewardContext(spec)
    return ManagedReward(kind_of(spec.function).build(spec.function, spec, context), context)
