"""Where tool calls run: HTTP endpoints, Python functions (sandboxed or in-process), stateful environments.

Every call ends in a ``ToolResult``. Two kinds of failure, kept apart:

- the tool answered that the call was wrong (an HTTP ``{"error": ...}`` answer, a Python function or an
  environment's ``step`` that raised, a tool the row does not offer): the error text goes back to the model
  as the tool message (it can learn from it) and is counted, ``fatal`` False;
- the tool could not answer (a timeout, HTTP errors after the retries, a sandboxed worker killed, an
  answer that is not ``{"content"}`` or ``{"error"}``): the episode ends there, ``fatal`` True, and the
  sample's reward is a failure of that kind (``on_reward_error`` applies: never a silent 0).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from openrft.errors import OpenRFTError
from openrft.rewards.remote import RemoteEndpoint, Timer
from openrft.rewards.sandbox import SandboxPool
from openrft.rewards.types import RewardFailure
from openrft.spec.rewards import SandboxSpec
from openrft.spec.tools import EnvironmentSpec, HttpToolSpec, PythonToolSpec, ToolsSpec

SANDBOX_CRASHES = ("killed its sandboxed worker", "MemoryError")


class ToolConfigError(OpenRFTError):
    """A tool's configuration cannot work (a module that does not import, a missing function or class)."""


@dataclass
class ToolResult:
    content: str
    error_kind: str | None = None  # a RewardOutcome error kind, or "tool_error" / "unknown_tool"
    fatal: bool = False
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_kind is None


@dataclass
class CallContext:
    """What a runner may send along with a call: the row's id and the conversation so far."""

    example_id: str
    messages: list[dict[str, Any]]
    environment: Any = None  # this episode's Environment instance, when the job has one


class ToolRunner(Protocol):
    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult: ...


def as_content(value: Any) -> str:
    """A tool's return value as the tool message's text: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _failure(exc: RewardFailure) -> ToolResult:
    return ToolResult(content=exc.message, error_kind=exc.kind, fatal=True)


class HttpTool:
    """``POST url {name, arguments, call_id, example_id, messages}`` -> ``{"content": str}`` or ``{"error": str}``."""

    def __init__(self, name: str, spec: HttpToolSpec, client: httpx.AsyncClient):
        self.endpoint = RemoteEndpoint(spec.url, spec.remote, 30.0, f"tool {name}", client)

    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult:
        body = {
            "name": name,
            "arguments": arguments,
            "call_id": call_id,
            "example_id": context.example_id,
            "messages": context.messages,
        }
        try:
            answer = await self.endpoint.post_json(body)
        except RewardFailure as exc:
            return _failure(exc)
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            return ToolResult(content=f"error: {answer['error']}", error_kind="tool_error")
        if isinstance(answer, dict) and "content" in answer:
            return ToolResult(content=as_content(answer["content"]))
        return ToolResult(
            content=f"tool {name} answered {str(answer)[:120]!r}, not {{'content': ...}} or {{'error': ...}}",
            error_kind="invalid_output",
            fatal=True,
        )


def load_module(module: str, what: str):
    """A module from a file path (``env.py``) or an importable name (``package.module``)."""
    try:
        if module.endswith(".py"):
            path = Path(module)
            spec = importlib.util.spec_from_file_location(f"openrft_tool_{path.stem}_{abs(hash(module))}", path)
            if spec is None or spec.loader is None or not path.is_file():
                raise FileNotFoundError(f"no file {module}")
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = loaded
            spec.loader.exec_module(loaded)
            return loaded
        return importlib.import_module(module)
    except Exception as exc:
        raise ToolConfigError(f"{what}: cannot import {module}: {type(exc).__name__}: {exc}") from None


async def _in_thread(function, args: tuple, kwargs: dict, timeout_s: float) -> Any:
    """Call a sync or async function with a time limit (a sync one in a worker thread, not killed on timeout)."""
    if inspect.iscoroutinefunction(function):
        return await asyncio.wait_for(function(*args, **kwargs), timeout_s)
    return await asyncio.wait_for(asyncio.to_thread(function, *args, **kwargs), timeout_s)


class PythonTool:
    """``function(**arguments)``: in the reward sandbox (the module's source is sent), or in-process."""

    ENTRY = "__openrft_tool_call__"

    def __init__(self, name: str, spec: PythonToolSpec, pool: SandboxPool | None):
        self.name, self.spec, self.pool = name, spec, pool
        module, _, function = spec.function.rpartition(":")
        if not module or not function:
            raise ToolConfigError(f"tools.functions.{name}.function: {spec.function!r} is not file.py:function")
        if spec.sandboxed:
            if not module.endswith(".py") or not Path(module).is_file():
                raise ToolConfigError(
                    f"tools.functions.{name}.function: a sandboxed tool is a single file.py:function; {module!r} is not"
                )
            self.source = Path(module).read_text() + (
                f"\n\ndef {self.ENTRY}(arguments):\n    return {function}(**arguments)\n"
            )
        else:
            self.function = getattr(load_module(module, f"tool {name}"), function, None)
            if not callable(self.function):
                raise ToolConfigError(f"tools.functions.{name}.function: {module} has no function {function}")

    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult:
        if self.pool is not None:
            result = await self.pool.call(self.source, self.ENTRY, [arguments], self.spec.timeout_s)
            if result.ok:
                return ToolResult(content=as_content(result.value))
            message = result.message or ""
            if result.kind == "runtime_error" and not any(s in message for s in SANDBOX_CRASHES):
                last_line = message.strip().splitlines()[-1] if message.strip() else "the tool raised"
                return ToolResult(content=f"error: {last_line}", error_kind="tool_error")
            return ToolResult(content=f"tool {name}: {result.message}", error_kind=result.kind, fatal=True)
        try:
            value = await _in_thread(self.function, (), arguments, self.spec.timeout_s)
        except TimeoutError:
            message = f"tool {name} ran past its time limit of {self.spec.timeout_s:g} s"
            return ToolResult(content=message, error_kind="timeout", fatal=True)
        except Exception as exc:
            return ToolResult(content=f"error: {type(exc).__name__}: {exc}", error_kind="tool_error")
        return ToolResult(content=as_content(value))


class EnvironmentFactory:
    """Makes one ``Environment(config)`` per rollout; runs its ``reset``, ``step`` and ``reward``."""

    def __init__(self, spec: EnvironmentSpec):
        self.spec = spec
        self.cls = getattr(load_module(spec.module, "tools.environment"), spec.class_name, None)
        if not inspect.isclass(self.cls) or not callable(getattr(self.cls, "step", None)):
            raise ToolConfigError(
                f"tools.environment: {spec.module} has no class {spec.class_name} with a step(name, arguments) method"
            )

    async def start(self, row: dict[str, Any]) -> Any:
        """A new environment, reset with the dataset row (raises RewardFailure when it cannot start)."""
        try:
            environment = self.cls(self.spec.config)
            if callable(getattr(environment, "reset", None)):
                await _in_thread(environment.reset, (row,), {}, self.spec.timeout_s)
        except TimeoutError:
            raise RewardFailure("timeout", f"environment reset ran past {self.spec.timeout_s:g} s") from None
        except Exception as exc:
            raise RewardFailure("runtime_error", f"environment reset: {type(exc).__name__}: {exc}") from None
        return environment

    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult:
        try:
            value = await _in_thread(context.environment.step, (name, arguments), {}, self.spec.timeout_s)
        except TimeoutError:
            message = f"environment step {name} ran past {self.spec.timeout_s:g} s"
            return ToolResult(content=message, error_kind="timeout", fatal=True)
        except Exception as exc:
            return ToolResult(content=f"error: {type(exc).__name__}: {exc}", error_kind="tool_error")
        return ToolResult(content=as_content(value))

    async def final_reward(self, environment: Any) -> float | None:
        """The environment's own reward for the episode, if it has a ``reward()`` that returns a number."""
        reward = getattr(environment, "reward", None)
        if not callable(reward):
            return None
        try:
            value = await _in_thread(reward, (), {}, self.spec.timeout_s)
        except TimeoutError:
            raise RewardFailure("timeout", f"environment reward ran past {self.spec.timeout_s:g} s") from None
        except Exception as exc:
            raise RewardFailure("runtime_error", f"environment reward: {type(exc).__name__}: {exc}") from None
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise RewardFailure("invalid_output", f"environment reward returned {value!r}, not a number")
        return float(value)


class ToolBox:
    """The runners of a job's tools, built in (and used from) one event loop."""

    def __init__(self, spec: ToolsSpec, sandbox: SandboxSpec):
        self.spec = spec
        self.sandbox = sandbox
        self.semaphore = asyncio.Semaphore(spec.max_concurrency)
        self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=spec.max_concurrency))
        self.pool = (
            SandboxPool(sandbox)
            if any(isinstance(r, PythonToolSpec) and r.sandboxed for r in spec.functions.values())
            else None
        )
        self.runners: dict[str, ToolRunner] = {}
        for name, runner in spec.functions.items():
            if isinstance(runner, HttpToolSpec):
                self.runners[name] = HttpTool(name, runner, self.client)
            else:
                self.runners[name] = PythonTool(name, runner, self.pool if runner.sandboxed else None)
        self.environment = EnvironmentFactory(spec.environment) if spec.environment else None

    async def call(
        self, name: str, arguments: dict[str, Any], call_id: str, offered: set[str], context: CallContext
    ) -> ToolResult:
        timer = Timer()
        runner = self.runners.get(name) or (self.environment if self.environment else None)
        if name not in offered or runner is None:
            listed = ", ".join(sorted(offered)) or "none"
            result = ToolResult(content=f"error: no tool {name!r} here; tools: {listed}", error_kind="unknown_tool")
        else:
            async with self.semaphore:
                result = await runner.run(name, arguments, call_id, context)
        result.latency_s = timer.elapsed
        return result

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
        await self.client.aclose()
