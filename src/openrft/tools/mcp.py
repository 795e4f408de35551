"""MCP servers as tool sources, through the official ``mcp`` Python SDK (``pip install 'openrft[mcp]'``).

A server is started as a subprocess (stdio) or reached over streamable HTTP. Its tools' schemas are read
from it (``tools/list``) and added, in OpenAI's shape, to every dataset row that does not already offer a
tool of that name, so the chat template shows them to the model. Calls run as ``tools/call`` with
``_meta`` ``{"openrft/episode_id", "openrft/turn"}``: how a server keeps state per episode over streamable
HTTP, whose current protocol is stateless. With ``session: episode`` each episode also gets a client
session of its own (for a stdio server: a process of its own), opened at the episode's first call and
closed when the episode ends; ``shared`` (the default) uses one session for every call.

An MCP client session lives inside anyio scopes that must be entered and left by one task, so each session
is held open by a task of its own and calls reach it through a queue.

A session that fails (its stdio process killed, its HTTP connection gone: every call would fail with
``Connection closed``) ends the episode whose call found it dead (``server_error``) and is dropped; the next
call opens a new one (a stdio server: a new process; an HTTP server: a new session). Every error names the
server, its URL or command, and the underlying error (not the SDK's ``ExceptionGroup``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from openrft.calls.transport import mcp_http_client
from openrft.data.records import Example
from openrft.errors import OpenRFTError
from openrft.spec.tools import McpServerSpec, ToolsSpec
from openrft.tools.results import CallContext, ToolConfigError, ToolResult

LOG = logging.getLogger(__name__)


class McpUnavailable(OpenRFTError):
    """The ``mcp`` package is not installed."""


def _client_class():
    try:
        from mcp import Client
    except ImportError:
        raise McpUnavailable(
            "tools.mcp_servers needs the official MCP SDK: pip install 'openrft[mcp]' (the `mcp` package)"
        ) from None
    return Client


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio's task groups wrap the error that matters)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    cause = root_cause(exc)
    text = str(cause) or repr(cause)
    return f"{type(cause).__name__}: {text}"


SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "auth", "credential")


def _secret(word: str) -> bool:
    return any(w in word.lower() for w in SECRET_WORDS)


def where(spec: McpServerSpec) -> str:
    """The server's URL (without credentials or query), or its command line (a value after, or in, an option
    named like a secret masked): errors reach the samples, which a service's tenant reads."""
    if spec.url is not None:
        url = urlsplit(str(spec.url))
        host = url.hostname or ""
        netloc = f"{host}:{url.port}" if url.port else host
        return urlunsplit((url.scheme, netloc, url.path, "", ""))
    if spec.command is not None:
        shown, hide = [], False
        for argument in spec.command:
            name, eq, _ = argument.partition("=")
            if hide:
                shown.append("***")
            elif eq and name.startswith("-") and _secret(name):
                shown.append(f"{name}=***")
            else:
                shown.append(argument)
            hide = argument.startswith("-") and not eq and _secret(argument)
        return "command " + " ".join(shown)
    return f"registered {spec.registered}"


def _target(name: str, spec: McpServerSpec) -> Any:
    if spec.registered is not None:
        raise ToolConfigError(
            f"tools.mcp_servers.{name}.registered: {spec.registered!r} names a server an operator registered with "
            "openrft serve --mcp-servers; only a job submitted to that service can use it: give a command or a url"
        )
    if spec.url is not None:
        return _http_transport(str(spec.url))
    from mcp import StdioServerParameters

    command, *args = spec.command or []
    return StdioServerParameters(command=command, args=args, env=spec.env or None, cwd=spec.cwd)


@asynccontextmanager
async def _http_transport(url: str) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport over a client of ``openrft.calls.transport`` (in a tenant's job it
    connects only to addresses the outbound policy checked)."""
    from mcp.client.streamable_http import streamable_http_client

    async with mcp_http_client() as client, streamable_http_client(url, http_client=client) as streams:
        yield streams


class McpSession:
    """One client session, held open by its own task; ``call`` sends it a request and waits for the answer."""

    def __init__(self, name: str, spec: McpServerSpec):
        self.name, self.spec = name, spec
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def start(self) -> McpSession:
        client_class = _client_class()
        target = _target(self.name, self.spec)  # an unresolved registered name fails here, by name
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(client_class, target, ready))
        await ready
        return self

    async def _serve(self, client_class: Any, target: Any, ready: asyncio.Future) -> None:
        try:
            async with client_class(target, read_timeout_seconds=self.spec.timeout_s) as client:
                ready.set_result(None)
                while (item := await self._queue.get()) is not None:
                    method, args, answer = item
                    try:
                        if method == "call_tool":  # (name, arguments, _, _, meta)
                            result = await client.call_tool(args[0], args[1], meta=args[4])
                        else:
                            result = await getattr(client, method)(*args)
                        answer.set_result(result)
                    except Exception as exc:
                        if not answer.done():
                            answer.set_exception(exc)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(
                    ToolConfigError(
                        f"tools.mcp_servers.{self.name} ({where(self.spec)}): cannot connect: {describe(exc)}"
                    )
                )
            while not self._queue.empty():  # requests that will not be served
                item = self._queue.get_nowait()
                if item is not None and not item[2].done():
                    item[2].set_exception(ConnectionError(f"the session closed: {describe(exc)}"))
            if not isinstance(exc, Exception):
                raise

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def request(self, method: str, *args: Any) -> Any:
        if not self.alive:
            raise ConnectionError("the session is closed")
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        await self._queue.put((method, args, answer))
        return await answer

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            await self._queue.put(None)
            try:
                await asyncio.wait_for(self._task, 10)
            except (TimeoutError, Exception):
                self._task.cancel()


def openai_tool(tool: Any) -> dict[str, Any]:
    """An MCP tool description in OpenAI's ``tools`` shape."""
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema or {"type": "object"}}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


async def discover(spec: ToolsSpec) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every MCP tool: name -> (server name, its OpenAI schema). Two servers with one tool name are an error."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for server, server_spec in spec.mcp_servers.items():
        session = await McpSession(server, server_spec).start()
        try:
            listed = await session.request("list_tools")
        finally:
            await session.aclose()
        for tool in listed.tools:
            if tool.name in found:
                raise ToolConfigError(
                    f"tools.mcp_servers: the tool {tool.name!r} is offered by both {found[tool.name][0]} and {server}"
                )
            if tool.name in spec.functions:
                raise ToolConfigError(f"tools.mcp_servers.{server}: {tool.name!r} is also in tools.functions")
            found[tool.name] = (server, openai_tool(tool))
    return found


def add_mcp_tools(spec: ToolsSpec, examples: list[Example]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The servers' tools added to every row that does not offer a tool of that name (before the prompts are
    rendered, so that the chat template shows them)."""
    found = asyncio.run(discover(spec))
    schemas = [schema for _, schema in found.values()]
    for example in examples:
        offered = {t["function"]["name"] for t in example.tools or [] if isinstance(t.get("function"), dict)}
        extra = [s for s in schemas if s["function"]["name"] not in offered]
        if extra:
            example.tools = [*(example.tools or []), *extra]
    return found


def _content(result: Any) -> str:
    """A ``tools/call`` result as the tool message: its text blocks, or its structured content as JSON."""
    texts = [getattr(block, "text", None) for block in result.content or []]
    if any(t is not None for t in texts):
        return "\n".join(t for t in texts if t is not None)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return json.dumps([block.model_dump(mode="json") for block in result.content or []])


class McpTool:
    """The runner of one MCP server's tools: a shared session, or one per episode."""

    def __init__(self, name: str, spec: McpServerSpec):
        self.name, self.spec = name, spec
        self.sessions: dict[str, McpSession] = {}
        self._opening: dict[str, asyncio.Task] = {}
        self.restarts = 0  # sessions opened again after one failed

    def _key(self, episode_id: str) -> str:
        return episode_id if self.spec.session == "episode" else ""

    async def _session(self, episode_id: str) -> McpSession:
        key = self._key(episode_id)
        if key in self.sessions and not self.sessions[key].alive:  # its process died, its connection closed
            await self._drop(key, self.sessions[key])
        if key not in self.sessions:
            if key not in self._opening:  # concurrent first calls of one key open one session
                self._opening[key] = asyncio.create_task(McpSession(self.name, self.spec).start())
            try:
                self.sessions[key] = await self._opening[key]
            finally:
                self._opening.pop(key, None)
        return self.sessions[key]

    async def _drop(self, key: str, session: McpSession) -> None:
        """Forget a failed session (the next call opens a new one) and close what is left of it."""
        if self.sessions.get(key) is session:
            del self.sessions[key]
            self.restarts += 1
            LOG.warning(
                "MCP server %s (%s): a call failed on its session; the next call opens a new one",
                self.name,
                where(self.spec),
            )
        await session.aclose()

    async def run(self, name: str, arguments: dict[str, Any], call_id: str, context: CallContext) -> ToolResult:
        session = None
        try:
            session = await self._session(context.episode_id)
            meta = {"openrft/episode_id": context.episode_id, "openrft/turn": context.turn}
            call = session.request("call_tool", name, arguments, None, None, meta)
            result = await asyncio.wait_for(call, self.spec.timeout_s)
        except TimeoutError:
            if session is not None:  # an HTTP server gone leaves its session's calls unanswered: a new one next
                await self._drop(self._key(context.episode_id), session)
            message = (
                f"MCP server {self.name} ({where(self.spec)}): {name} did not answer within {self.spec.timeout_s:g} s"
            )
            return ToolResult(content=message, error_kind="timeout", fatal=True)
        except Exception as exc:
            if session is not None:  # a session a call failed on is not trusted again: the next call opens one
                await self._drop(self._key(context.episode_id), session)
            if isinstance(exc, ToolConfigError):  # could not (re)connect: the message names the server already
                message = str(exc)
            else:
                message = f"MCP server {self.name} ({where(self.spec)}): {name}: {describe(exc)}"
            return ToolResult(content=message, error_kind="server_error", fatal=True)
        if result.is_error:
            return ToolResult(content=f"error: {_content(result)}", error_kind="tool_error")
        return ToolResult(content=_content(result))

    async def end_episode(self, episode_id: str) -> None:
        if self.spec.session == "episode" and episode_id in self.sessions:
            await self.sessions.pop(episode_id).aclose()

    async def aclose(self) -> None:
        sessions, self.sessions = list(self.sessions.values()), {}
        await asyncio.gather(*(s.aclose() for s in sessions))
