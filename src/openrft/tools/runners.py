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
import ctypes
import importlib
import importlib.util
import inspect
import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from openrft.calls.endpoints import RemoteEndpoint, Timer, async_client
from openrft.calls.failures import CallFailure
from openrft.calls.sandbox import SandboxPool
from openrft.spec.call_options import SandboxSpec
from openrft.spec.tools import EnvironmentSpec, HttpToolSpec, PythonToolSpec, ToolsSpec
from openrft.tools.results import CallContext, ToolConfigError, ToolResult

SANDBOX_CRASHES = ("killed its sandboxed worker", "MemoryError")


@dataclass
class Step:
    """What an environment's ``step`` may return instead of the bare tool message: the message, whether the
    episode ends with it (the model gets no further turn), and a reward for the turn that made the call."""

    content: Any
    done: bool = False
    reward: float | None = None


class ToolRunner(Protocol):
    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult: ...


def as_content(value: Any) -> str:
    """A tool's return value as the tool message's text: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _failure(exc: CallFailure) -> ToolResult:
    return ToolResult(content=exc.message, error_kind=exc.kind, fatal=True)


TOOL_RESPONSE_BYTES = 1 << 20
"""The most of an HTTP tool's answer read (a 32 MB answer took a job process to 3.5 GB)."""


class HttpTool:
    """``POST url {name, arguments, call_id, example_id, episode_id, turn, messages}`` -> ``{"content": str}``
    or ``{"error": str}``; with ``contract: function_call``, Azure's shapes (``FunctionCallTool``)."""

    def __init__(self, name: str, spec: HttpToolSpec, client: httpx.AsyncClient):
        azure = spec.contract == "function_call"
        self.endpoint = RemoteEndpoint(
            spec.url,
            spec.remote,
            30.0,
            f"tool {name}",
            client,
            headers=spec.headers,  # to this url only: the tools' client follows no redirect
            kind="endpoint of",
            max_response_bytes=FUNCTION_CALL_BYTES if azure else TOOL_RESPONSE_BYTES,
            answers_4xx=azure,
        )

    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult:
        body = {
            "name": name,
            "arguments": arguments,
            "call_id": call_id,
            "example_id": context.example_id,
            "episode_id": context.episode_id,
            "turn": context.turn,
            "messages": context.messages,
        }
        try:
            answer = await self.endpoint.post_json(body, key=context.example_id)
        except CallFailure as exc:
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


FUNCTION_CALL_BYTES = 1_000_000
"""Azure's bound on a tool call's payload and on its reply (1 MB each); past it, a 413 the model sees."""


class FunctionCallTool(HttpTool):
    """A tool server of Azure OpenAI's agentic RFT (``method.reinforcement.tools``): it is POSTed the model's call as
    a Responses API ``function_call`` item ``{type, id, call_id, name, arguments (a JSON string), trace_id}`` (the
    trace id the same for every call of an episode) and answers a ``function_call_output`` item ``{type, call_id,
    output, id}``. As Azure documents it: a call or reply over 1 MB is a 413 the model is shown, a 4xx answer's
    body is shown to the model, a 5xx is retried (``remote.max_retries``) and then ends the episode."""

    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult:
        body = {
            "type": "function_call",
            "id": f"fc_{call_id}",
            "call_id": call_id,
            "name": name,
            "arguments": json.dumps(arguments),
            "trace_id": f"trace_{context.episode_id or context.example_id}",
        }
        if len(json.dumps(body)) > FUNCTION_CALL_BYTES:
            return _shown(f"HTTP 413: the call to tool {name} is over Azure's bound of 1 MB; make it smaller")
        try:
            answer = await self.endpoint.post_json(body, key=context.example_id)
        except CallFailure as exc:
            if exc.kind == "invalid_output" and exc.status == 413:
                return _shown(f"HTTP 413: tool {name} answered more than Azure's bound of 1 MB")
            if exc.status is not None and 400 <= exc.status < 500:
                return _shown(exc.message)  # as Azure does: the error payload goes to the model
            return _failure(exc)
        if not (isinstance(answer, dict) and answer.get("type", "function_call_output") == "function_call_output"):
            return ToolResult(
                content=f"tool {name} answered {str(answer)[:120]!r}, not a function_call_output "
                "{'type': 'function_call_output', 'call_id': ..., 'output': ...}",
                error_kind="invalid_output",
                fatal=True,
            )
        if "output" not in answer:
            return _shown(f"tool {name} answered no output: {json.dumps(answer)[:400]}")
        return ToolResult(content=as_content(answer["output"]))


def _shown(message: str) -> ToolResult:
    """A tool's error the model reads as the call's result; the episode goes on (a counted ``tool_error``)."""
    return ToolResult(content=f"error: {message}", error_kind="tool_error")


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


class ToolTimeout(Exception):
    """Raised inside a tool's worker thread that ran past its time limit, to stop it."""


async def _in_thread(function, args: tuple, kwargs: dict, timeout_s: float) -> Any:
    """Call a sync or async function with a time limit. A sync one runs in a thread of its own; on timeout
    ``ToolTimeout`` is raised inside that thread (it stops at its next Python instruction, so a tool in a
    Python loop does not keep running; one blocked inside a C call stops when the call returns)."""
    if inspect.iscoroutinefunction(function):
        return await asyncio.wait_for(function(*args, **kwargs), timeout_s)
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            try:
                value, ok = function(*args, **kwargs), True
            except ToolTimeout:
                raise
            except BaseException as exc:  # handed to the caller
                value, ok = exc, False
            loop.call_soon_threadsafe(settle, ok, value)
        except (ToolTimeout, RuntimeError):  # stopped on timeout; or the loop closed meanwhile
            pass

    thread = threading.Thread(target=work, name="openrft-tool-call", daemon=True)
    thread.start()
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError:
        stop_thread(thread)
        raise


def stop_thread(thread: threading.Thread) -> None:
    """Raise ToolTimeout in ``thread`` (CPython's asynchronous exception), once."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(ToolTimeout))


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
        try:
            return ToolResult(content=as_content(value))
        except (TypeError, ValueError) as exc:  # as the sandbox says of such a value
            message = f"tool {name} returned a value that is not JSON ({type(value).__name__}): {exc}"
            return ToolResult(content=message, error_kind="invalid_output", fatal=True)


def observation_messages(value: Any) -> list[dict[str, Any]]:
    """What ``reset`` returned as the episode's opening messages: nothing (None), a user message (a string),
    a message (a dict with a role) or a list of them."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages = value if isinstance(value, list) else [value]
    for message in messages:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str) and "content" in message):
            raise CallFailure(
                "invalid_output",
                f"environment reset returned {str(value)[:120]!r}: an opening observation is a string, a message "
                "{'role': ..., 'content': ...} or a list of messages",
            )
    return [dict(m) for m in messages]


class EnvironmentFactory:
    """Makes one ``Environment(config)`` per episode; runs its ``reset``, ``step``, ``reward`` and ``close``."""

    def __init__(self, spec: EnvironmentSpec):
        self.spec = spec
        self.cls = getattr(load_module(spec.module, "tools.environment"), spec.class_name, None)
        if not inspect.isclass(self.cls) or not callable(getattr(self.cls, "step", None)):
            raise ToolConfigError(
                f"tools.environment: {spec.module} has no class {spec.class_name} with a step(name, arguments) method"
            )

    async def _call(self, what: str, method, *args: Any) -> Any:
        try:
            return await _in_thread(method, args, {}, self.spec.timeout_s)
        except TimeoutError:
            raise CallFailure("timeout", f"environment {what} ran past {self.spec.timeout_s:g} s") from None
        except CallFailure:
            raise
        except Exception as exc:
            raise CallFailure("runtime_error", f"environment {what}: {type(exc).__name__}: {exc}") from None

    async def start(self, row: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
        """A new environment reset with the dataset row, and its opening messages (raises CallFailure when
        it cannot start; the environment made is then closed)."""
        try:
            environment = self.cls(self.spec.config)
        except Exception as exc:
            raise CallFailure("runtime_error", f"environment {self.spec.class_name}(config): {exc}") from None
        reset = getattr(environment, "reset", None)
        try:
            opening = await self._call("reset", reset, row) if callable(reset) else None
            return environment, observation_messages(opening)
        except CallFailure:
            await self.close(environment)
            raise

    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult:
        try:
            value = await _in_thread(context.environment.step, (name, arguments), {}, self.spec.timeout_s)
        except TimeoutError:
            message = f"environment step {name} ran past {self.spec.timeout_s:g} s"
            return ToolResult(content=message, error_kind="timeout", fatal=True)
        except Exception as exc:
            return ToolResult(content=f"error: {type(exc).__name__}: {exc}", error_kind="tool_error")
        if isinstance(value, Step):
            try:
                reward = None if value.reward is None else _number(value.reward, f"environment step {name}: reward")
            except CallFailure as failure:
                return ToolResult(content=failure.message, error_kind=failure.kind, fatal=True)
            return ToolResult(content=as_content(value.content), done=bool(value.done), reward=reward)
        return ToolResult(content=as_content(value))

    async def final_reward(self, environment: Any, messages: list[dict[str, Any]]) -> float | None:
        """The environment's own reward for the episode, if it has a ``reward()`` that returns a number;
        ``reward(messages)`` when it takes an argument (the whole conversation: prompt and episode)."""
        reward = getattr(environment, "reward", None)
        if not callable(reward):
            return None
        value = await self._call("reward", reward, *([messages] if _takes_argument(reward) else []))
        return None if value is None else _number(value, "environment reward")

    async def state(self, environment: Any) -> Any:
        """The environment's ``state()`` (JSON) at the episode's end, for the job's reward; None without one."""
        state = getattr(environment, "state", None)
        if not callable(state):
            return None
        value = await self._call("state", state)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise CallFailure(
                "invalid_output", f"environment state() returned {str(value)[:120]!r}, not JSON"
            ) from None
        return value

    async def close(self, environment: Any) -> str | None:
        """Call ``close()`` if the environment has one; its failure is returned (reported, never raised)."""
        close = getattr(environment, "close", None)
        if not callable(close):
            return None
        try:
            await self._call("close", close)
        except CallFailure as failure:
            return failure.message
        return None


def _takes_argument(method) -> bool:
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise CallFailure("invalid_output", f"{what} returned {value!r}, not a number")
    return float(value)


def truncated(content: str, limit: int | None) -> str:
    """``content`` cut to ``limit`` characters, the cut said at the end (within the limit)."""
    if limit is None or len(content) <= limit:
        return content
    note = f"\n[truncated: {len(content):,} characters, the first {{kept:,}} shown]"
    kept = max(0, limit - len(note.format(kept=limit)))
    return content[:kept] + note.format(kept=kept)


class ToolBox:
    """The runners of a job's tools, built in (and used from) one event loop."""

    def __init__(self, spec: ToolsSpec, sandbox: SandboxSpec):
        self.spec = spec
        self.sandbox = sandbox
        self.semaphore = asyncio.Semaphore(spec.max_concurrency)
        limits = httpx.Limits(max_connections=spec.max_concurrency)
        self.client = async_client(limits=limits, follow_redirects=False)
        self.pool = (
            SandboxPool(sandbox)
            if any(isinstance(r, PythonToolSpec) and r.sandboxed for r in spec.functions.values())
            else None
        )
        self.runners: dict[str, ToolRunner] = {}
        for name, runner in spec.functions.items():
            if isinstance(runner, HttpToolSpec):
                maker = FunctionCallTool if runner.contract == "function_call" else HttpTool
                self.runners[name] = maker(name, runner, self.client)
            else:
                self.runners[name] = PythonTool(name, runner, self.pool if runner.sandboxed else None)
        self.environment = EnvironmentFactory(spec.environment) if spec.environment else None
        self.mcp: list[Any] = []

    async def start(self) -> ToolBox:
        """Connect to the MCP servers and route each of their tools there (``openrft.tools.mcp``)."""
        if self.spec.mcp_servers:
            from openrft.tools.mcp import McpTool, discover

            servers = {name: McpTool(name, server) for name, server in self.spec.mcp_servers.items()}
            self.mcp = list(servers.values())
            for tool, (server, _) in (await discover(self.spec)).items():
                self.runners[tool] = servers[server]
        return self

    async def end_episode(self, episode_id: str) -> None:
        """Close what an episode held open (its MCP sessions)."""
        for server in self.mcp:
            await server.end_episode(episode_id)

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
        result.content = truncated(result.content, self.spec.max_output_chars)
        result.latency_s = timer.elapsed
        return result

    async def aclose(self) -> None:
        for server in self.mcp:
            await server.aclose()
        if self.pool is not None:
            await self.pool.aclose()
        await self.client.aclose()
