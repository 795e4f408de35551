"""Multi-turn rollouts with tools: where each tool a dataset row offers runs, and how long an episode may go.

The rows name their tools (OpenAI's ``tools`` schema); this block says where a call of each name runs:

- ``functions.<name>: {type: http, url}``: a JSON POST per call (docs/tools.md has the request and answer);
- ``functions.<name>: {type: python, function: "file.py:fn"}``: ``fn(**arguments)`` in the reward sandbox
  (``sandboxed: false`` runs trusted code in-process);
- ``environment: {module: "env.py", class_name: Environment}``: one object per rollout, ``reset`` with the
  row, ``step`` per call of any tool not in ``functions``, and an optional final ``reward``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openrft.spec.call_options import MAX_CALL_CONCURRENCY, MAX_CALL_TIMEOUT_S, RemoteCallSpec
from openrft.spec.urls import HttpUrl

MAX_TURNS = 64
MALFORMED_CALL_MESSAGE = (
    "error: the tool call could not be read ({error}); write each call in the format the instructions show"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class HttpToolSpec(_Strict):
    type: Literal["http"]
    url: HttpUrl = Field(description="POST {name, arguments, call_id, example_id, messages} -> {content} or {error}")
    remote: RemoteCallSpec = Field(
        default_factory=lambda: RemoteCallSpec(timeout_s=30.0, max_retries=2),
        description="timeout per attempt, retries, backoff, circuit breaker (as for reward endpoints)",
    )
    contract: Literal["openrft", "function_call"] = Field(
        "openrft",
        description="openrft: the request and answer above; function_call: Azure OpenAI's agentic RFT tool servers "
        "(a Responses function_call in, a function_call_output back; docs/tools.md)",
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="sent with every call to url and nowhere else (a tenant's token: never in events, logs or MLflow)",
    )


HEADER_MASK = "***"


def masked_headers(dumped: dict[str, Any]) -> dict[str, Any]:
    """A JobSpec's JSON dump with the values of its tools' ``headers`` masked, for what is shown or logged."""
    functions = (dumped.get("tools") or {}).get("functions") or {}
    masked = {
        name: {**runner, "headers": {key: HEADER_MASK for key in runner["headers"]}}
        if runner.get("headers")
        else runner
        for name, runner in functions.items()
    }
    return {**dumped, "tools": {**dumped["tools"], "functions": masked}} if functions else dumped


class PythonToolSpec(_Strict):
    type: Literal["python"]
    function: str = Field(description="file.py:function (relative to the job file) or package.module:function")
    sandboxed: bool = Field(True, description="run in the reward sandbox (a single-file module); False = in-process")
    timeout_s: float = Field(30.0, gt=0, le=MAX_CALL_TIMEOUT_S)


ToolRunnerSpec = Annotated[HttpToolSpec | PythonToolSpec, Field(discriminator="type")]


class EnvironmentSpec(_Strict):
    module: str = Field(description="env.py (relative to the job file) or package.module")
    class_name: str = "Environment"
    config: dict[str, Any] = Field(default_factory=dict, description="passed to the class: Environment(config)")
    timeout_s: float = Field(30.0, gt=0, le=MAX_CALL_TIMEOUT_S, description="per reset / step / reward call")


class McpServerSpec(_Strict):
    """An MCP server whose tools the rows may call: started as a subprocess (``command``, stdio), reached at
    ``url`` (streamable HTTP), or one the service's operator registered (``registered``: its name; the service
    puts the operator's definition in its place when the job is submitted). Its tools' schemas are read from
    the server and added to every row. A stdio server runs a command on the machine: on a service, only the
    operator defines one (docs/service.md, Security)."""

    command: list[str] | None = Field(None, min_length=1, description="stdio: the server's command and arguments")
    url: HttpUrl | None = Field(
        None, description="streamable HTTP: the server's MCP endpoint, e.g. http://host:8000/mcp"
    )
    registered: str | None = Field(
        None,
        min_length=1,
        description="the name of an MCP server the service's operator registered (openrft serve --mcp-servers)",
    )
    env: dict[str, str] = Field(default_factory=dict, description="stdio: environment variables added for the server")
    cwd: str | None = Field(None, description="stdio: the working directory (relative to the job file)")
    session: Literal["shared", "episode"] = Field(
        "shared", description="one session for every call, or one per episode (a stateful server)"
    )
    timeout_s: float = Field(30.0, gt=0, le=MAX_CALL_TIMEOUT_S, description="per call")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        given = [self.command, self.url, self.registered]
        if sum(value is not None for value in given) != 1:
            raise ValueError(
                "give exactly one of command (a stdio server), url (streamable HTTP) and registered (a server the "
                "service's operator registered)"
            )
        if self.command is None and (self.env or self.cwd is not None):
            raise ValueError("env and cwd are settings of a stdio server (command)")
        return self


class ToolsSpec(_Strict):
    """Tool use in rollouts: the model generates, its calls run, the results go back through the chat
    template, until it answers without a call, ``max_turns`` model turns were taken, or the token budget
    (``sampling.max_new_tokens``, tool results included) is spent."""

    max_turns: int = Field(4, ge=1, le=MAX_TURNS, description="model turns per episode")
    functions: dict[str, ToolRunnerSpec] = Field(default_factory=dict)
    environment: EnvironmentSpec | None = None
    mcp_servers: dict[str, McpServerSpec] = Field(
        default_factory=dict, description="MCP servers by name: their tools run there (docs/tools.md)"
    )
    max_concurrency: int = Field(64, ge=1, le=MAX_CALL_CONCURRENCY, description="tool calls in flight at once")
    max_calls_per_turn: int = Field(
        16, ge=1, le=999, description="calls run per model turn; the rest are answered with an error message"
    )
    max_output_chars: int | None = Field(
        16384, ge=16, description="a tool message longer than this is cut, with a note saying so (null: never)"
    )
    malformed_call_message: str | None = Field(
        MALFORMED_CALL_MESSAGE,
        description="the tool message that answers a call block that cannot be read ({error}: what was wrong); "
        "null: such a turn is the episode's answer",
    )
    schedule: Literal["independent", "lockstep"] = Field(
        "independent",
        description="independent: each episode's next turn is sampled as soon as its own calls are back; "
        "lockstep: turn k of every episode in one batch after every call of turn k-1 (reproducible with a seed)",
    )
    max_episodes_in_flight: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="independent schedule: episodes running at once; a generate's further prompts start as "
        "running episodes end (null: all at once)",
    )
    error_budget: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="the share of a batch's episodes (a training step's, or an evaluation's) that may end on an "
        "error (a template error, a tool or MCP server that cannot answer, a parse failure); past it the job "
        "fails, naming the most frequent cause",
    )
    turn_rewards: Literal["ignore", "sum"] = Field(
        "ignore",
        description="per-turn rewards an environment's step returns: ignored, or added to the episode's reward "
        "(the sample's return over its turns)",
    )

    def relative_to(self, base_dir: Path) -> ToolsSpec:
        """File paths (``file.py:fn``, ``env.py``) made absolute against the job file's directory."""
        functions = {
            name: runner.model_copy(update={"function": _absolute_target(runner.function, base_dir)})
            if isinstance(runner, PythonToolSpec)
            else runner
            for name, runner in self.functions.items()
        }
        environment = self.environment
        if environment is not None and environment.module.endswith(".py"):
            environment = environment.model_copy(update={"module": str((base_dir / environment.module).resolve())})
        servers = {
            name: server.model_copy(update={"cwd": str((base_dir / (server.cwd or ".")).resolve())})
            if server.command is not None
            else server
            for name, server in self.mcp_servers.items()
        }
        return self.model_copy(update={"functions": functions, "environment": environment, "mcp_servers": servers})


def _absolute_target(target: str, base_dir: Path) -> str:
    module, sep, function = target.rpartition(":")
    if module.endswith(".py"):
        return f"{(base_dir / module).resolve()}{sep}{function}"
    return target
