"""Rewards written as Python functions, named ``module:function``.

The function takes one batch: a list of dicts in the Nova Lambda input shape (``id``,
``messages`` ending with the assistant's answer, ``metadata``) plus ``completion``,
``reference_answer`` (also under ``metadata``) and ``step``. It returns a list with one entry per
sample: a number, ``{"score", "sub_scores", "metrics"}``, or a Nova output entry
(``aggregate_reward_score``, ``metrics_list``). It may be ``async``.

In-process (default) the function is trusted code: it runs in a worker thread with the sandbox
time limit, and a call that passes it is reported as a ``timeout`` (the thread is not killed). With
``sandboxed: true`` the function's module, which must be a single file, runs in the sandbox pool.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from openrft.calls.endpoints import Timer
from openrft.calls.sandbox import SandboxPool
from openrft.errors import RewardError
from openrft.rewards.capture import captured_stdout
from openrft.rewards.kinds import REWARD_ROOT, Needs
from openrft.rewards.kinds.nova_lambda import nova_entry, parse_result_entry
from openrft.rewards.types import RewardContext, RewardFailure, RewardOutcome, RewardSample, check_source
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.rewards import CallableReward, RewardSpec

CONFIG = CallableReward

CALLABLE_TIME_LIMIT_S = 120.0


def batch_entry(sample: RewardSample) -> dict[str, Any]:
    entry = nova_entry(sample)
    entry.update(
        completion=sample.completion, reference_answer=sample.example.fields.get("reference_answer"), step=sample.step
    )
    return entry


def resolve_target(target: str) -> tuple[str, str]:
    module, _, function = target.partition(":")
    return module, function


def load_function(target: str):
    module_name, function_name = resolve_target(target)
    try:
        with captured_stdout() as printed:  # what a module prints on import goes to stderr, not stdout
            try:
                module = importlib.import_module(module_name)
            finally:
                sys.stderr.write(printed.getvalue())
    except Exception as exc:
        raise RewardError(
            f"reward callable {target}: cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise RewardError(f"reward callable {target}: module {module_name} has no function {function_name}")
    return function


def module_source(target: str) -> str:
    module_name, _function_name = resolve_target(target)
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        raise RewardError(f"reward callable {target}: cannot find {module_name}: {exc}") from None
    if spec is None or not spec.origin or not spec.origin.endswith(".py") or spec.submodule_search_locations:
        raise RewardError(
            f"reward callable {target}: a sandboxed callable's module must be a single .py file "
            f"(found {spec.origin if spec else 'nothing'})"
        )
    return Path(spec.origin).read_text(encoding="utf-8")


def outcomes_from(result: Any, samples: list[RewardSample], what: str) -> list[RewardOutcome]:
    if not isinstance(result, list | tuple) or len(result) != len(samples):
        size = len(result) if isinstance(result, list | tuple) else type(result).__name__
        return [
            RewardOutcome.failure("invalid_output", f"{what} returned {size} results for {len(samples)} samples")
            for _ in samples
        ]
    outcomes = []
    for entry in result:
        try:
            outcomes.append(parse_result_entry(entry, what))
        except RewardFailure as failure:
            outcomes.append(RewardOutcome.of_failure(failure))
    return outcomes


def build(config: CallableReward, spec: RewardSpec, context: RewardContext) -> CallableFunction:
    """In-process: the function imported; sandboxed: its module's source read (once) and checked."""
    where = f"{REWARD_ROOT}.target"
    try:
        if not config.sandboxed:
            return CallableFunction(config.target, load_function(config.target), context)
        source = module_source(config.target)
    except RewardError as exc:
        raise SpecError([FieldProblem(where, str(exc))], "the reward configuration") from None
    entry = resolve_target(config.target)[1]
    problems = check_source(source, entry, 1, where)
    pool = context.pool(where, problems)
    if pool is None or problems:
        raise SpecError(problems, "the reward configuration")
    return CallableFunction(config.target, None, context, (source, entry, pool))


def needs(config: CallableReward) -> Needs:
    return Needs(privileges=[("target", config.target, "a Python callable run by the service")])


class CallableFunction:
    """``function`` run in-process, or ``sandboxed`` = (module source, function name, pool) run in the sandbox."""

    requires_reference = False

    def __init__(
        self,
        target: str,
        function: Any,
        context: RewardContext,
        sandboxed: tuple[str, str, SandboxPool] | None = None,
    ):
        self.name = target
        self.target = target
        self.time_limit_s = context.spec.sandbox.time_limit_s or CALLABLE_TIME_LIMIT_S
        self.sandboxed = sandboxed is not None
        if sandboxed is not None:
            self.source, self.entry, self.pool = sandboxed
        else:
            self.function = function

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        timer = Timer()
        batch = [batch_entry(s) for s in samples]
        printed: list[str] = []
        try:
            result = await (self._sandboxed(batch, printed) if self.sandboxed else self._in_process(batch, printed))
        except RewardFailure as failure:
            outcomes = [RewardOutcome.of_failure(failure) for _ in samples]
        else:
            outcomes = outcomes_from(result, samples, self.target)
        for outcome in outcomes:
            outcome.latency_s = timer.elapsed
            outcome.stdout = "".join(printed)  # the batch's output, on each of its samples
            if self.sandboxed and self.pool.weak:
                outcome.metrics["sandbox_weak"] = 1.0
        return outcomes

    async def _in_process(self, batch: list[dict[str, Any]], printed: list[str]) -> Any:
        with captured_stdout() as buffer:
            try:
                if inspect.iscoroutinefunction(self.function):
                    return await asyncio.wait_for(_no_exit_async(self.function, batch), self.time_limit_s)
                return await asyncio.wait_for(asyncio.to_thread(_no_exit, self.function, batch), self.time_limit_s)
            except TimeoutError:
                raise RewardFailure("timeout", f"{self.target} ran past {self.time_limit_s:g} s") from None
            except Exception as exc:
                raise RewardFailure("runtime_error", f"{self.target} raised {type(exc).__name__}: {exc}") from None
            finally:
                printed.append(buffer.getvalue())

    async def _sandboxed(self, batch: list[dict[str, Any]], printed: list[str]) -> Any:
        result = await self.pool.call(self.source, self.entry, [batch], self.time_limit_s)
        printed.append(result.stdout)
        if not result.ok:
            raise RewardFailure(result.kind, f"{self.target}: {result.message}")  # type: ignore[arg-type]
        return result.value

    async def aclose(self) -> None:
        return None


class _Exited(Exception):
    """``sys.exit()`` called by a reward: its samples' failure, never the process's (asyncio would let a
    SystemExit out of the event loop)."""

    def __str__(self) -> str:
        return f"called sys.exit({repr(self.args[0])[:80]})"


def _no_exit(function: Any, batch: list[dict[str, Any]]) -> Any:
    try:
        return function(batch)
    except SystemExit as exc:
        raise _Exited(exc.code) from None


async def _no_exit_async(function: Any, batch: list[dict[str, Any]]) -> Any:
    try:
        return await function(batch)
    except SystemExit as exc:
        raise _Exited(exc.code) from None
