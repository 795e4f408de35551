"""RewardSpec -> a RewardFunction, with every configuration problem reported before the job starts."""

from __future__ import annotations

from typing import Any

from openrft.errors import RewardError
from openrft.rewards.context import RewardContext
from openrft.rewards.types import RewardFunction, RewardOutcome, RewardSample
from openrft.spec.errors import SpecError
from openrft.spec.rewards import (
    CallableReward,
    NovaLambdaReward,
    OpenAIGraderReward,
    PresetReward,
    RewardSpec,
    VertexReward,
)


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


def build_function(spec: RewardSpec, context: RewardContext) -> RewardFunction:
    config = spec.function
    if isinstance(config, PresetReward):
        from openrft.rewards.presets import PRESETS

        return PRESETS[config.name]()
    if isinstance(config, VertexReward):
        from openrft.rewards.vertex import VertexCompositeFunction, VertexSingleFunction

        if config.composite is not None:
            return VertexCompositeFunction(config.composite, context)
        assert config.single is not None
        return VertexSingleFunction(config.single, context)
    if isinstance(config, OpenAIGraderReward):
        from openrft.rewards.graders import GraderFunction

        return GraderFunction(config.grader, context)
    if isinstance(config, NovaLambdaReward):
        from openrft.rewards.nova import NOVA_TIMEOUT_S, HttpInvoker, NovaLambdaFunction

        invoker: Any
        if config.transport == "handler":
            from openrft.rewards.lambdas import HandlerInvoker

            limit = spec.sandbox.time_limit_s or NOVA_TIMEOUT_S
            invoker = HandlerInvoker(config.endpoint, context.pool(), limit)
        elif config.transport == "aws":
            from openrft.rewards.lambdas import AwsLambdaInvoker

            invoker = AwsLambdaInvoker(config.endpoint, spec.remote.timeout_s or NOVA_TIMEOUT_S)
        else:
            invoker = HttpInvoker(context.endpoint(config.endpoint, NOVA_TIMEOUT_S, "Nova reward endpoint"))
        return NovaLambdaFunction(invoker, config.batch_size, config.concurrency_limit)
    if isinstance(config, CallableReward):
        from openrft.rewards.callables import CallableFunction

        return CallableFunction(config.target, config.sandboxed, context)
    raise RewardError(f"reward type {config.type!r} is not available in this build")


def build_reward(spec: RewardSpec) -> ManagedReward:
    """Check the configuration (formulas, templates, user code, judge endpoint, sandbox), then build."""
    from openrft.rewards.checks import check_reward

    problems = check_reward(spec)
    if problems:
        raise SpecError(problems, "the reward configuration")
    context = RewardContext(spec)
    return ManagedReward(build_function(spec, context), context)
