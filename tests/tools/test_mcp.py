"""MCP servers as tool sources, against a real MCP server (tests/tools/mcp_server.py, the official SDK) started by
the tests: over stdio and streamable HTTP, its tools' schemas read from it, shared and per-episode sessions."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from openrft.data.records import Example
from openrft.spec.tools import ToolsSpec
from openrft.tools.mcp import add_mcp_tools
from tests.tools.scripted import tool_tokenizer
from tests.tools.test_episodes import Episodes

pytest.importorskip("mcp")

SERVER = Path(__file__).resolve().parent / "mcp_server.py"


@pytest.fixture(scope="module")
def tokenizer():
    return tool_tokenizer()


def invoke(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def row(id: str = "q") -> Example:
    return Example(id=id, messages=[{"role": "user", "content": "Count twice."}], fields={"reference_answer": "2"})


def bump_twice(context: str) -> str:
    return invoke("bump") if context.count("<tool_response>") < 2 else "done"


def stdio(session: str = "shared") -> dict:
    return {"mcp_servers": {"local": {"command": [sys.executable, str(SERVER), "stdio"], "session": session}}}


def with_server_tools(tools: dict, examples: list[Example]) -> list[Example]:
    add_mcp_tools(ToolsSpec.model_validate(tools), examples)
    return examples


def responses(completion) -> list[str]:
    return [m["content"] for m in completion.turns if m["role"] == "tool"]


def test_the_servers_tools_are_discovered_and_offered_in_the_prompt(tokenizer):
    examples = with_server_tools(stdio(), [row()])
    assert {t["function"]["name"] for t in examples[0].tools} == {"add", "bump", "refuse", "tally"}
    add = next(t for t in examples[0].tools if t["function"]["name"] == "add")
    assert add["function"]["parameters"]["required"] == ["a", "b"]
    assert add["function"]["description"] == "Adds two integers"

    def policy(context: str) -> str:
        if "<tool_response>" not in context:
            return invoke("add", a=2, b=3)
        if context.count("<tool_response>") == 1:
            return invoke("refuse", reason="no")
        return "5"

    with Episodes(tokenizer, policy, stdio(), examples) as episodes:
        assert "add(a,b)" in tokenizer.decode(episodes.prompts[0])  # the template rendered the discovered tool
        ((completion,),) = episodes.run()
    assert responses(completion)[0] == "5"
    assert responses(completion)[1].startswith("error: ")  # a tool error goes back to the model
    assert completion.text == "5" and "tool_failure" not in completion.metadata


@pytest.mark.parametrize("session", ["shared", "episode"])
def test_stdio_sessions_shared_or_per_episode(tokenizer, session):
    examples = with_server_tools(stdio(session), [row()])
    with Episodes(tokenizer, bump_twice, stdio(session), examples) as episodes:
        (group,) = episodes.run(n=3)
    seen = sorted(r for c in group for r in responses(c))
    if session == "episode":  # each episode its own server session: its counter starts at 1
        assert all(responses(c) == ["bump 1", "bump 2"] for c in group)
    else:  # one session for all: six calls counted together
        assert seen == sorted(f"bump {i}" for i in range(1, 7))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(port: int | None = None):
    """The test server over streamable HTTP, in a process of its own: ``(url, process)``."""
    port = port or free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("the MCP server did not start")
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def http_server():
    with serving() as (url, _):
        yield url


@pytest.mark.parametrize("session", ["shared", "episode"])
def test_streamable_http_keeps_state_per_episode(tokenizer, http_server, session):
    """Over streamable HTTP each call carries the episode's id and turn; a server keeps its state by them."""
    tools = {"mcp_servers": {"remote": {"url": http_server, "session": session}}}
    examples = with_server_tools(tools, [row()])

    def tally_twice(context: str) -> str:
        return invoke("tally") if context.count("<tool_response>") < 2 else "done"

    with Episodes(tokenizer, tally_twice, tools, examples) as episodes:
        (group,) = episodes.run(n=3)
    assert all(responses(c) == ["tally 1 turn 1", "tally 2 turn 2"] for c in group)


def test_a_server_that_cannot_start_is_a_clear_error(tokenizer):
    tools = {"mcp_servers": {"gone": {"command": [sys.executable, "-c", "raise SystemExit(3)"]}}}
    with pytest.raises(Exception, match=r"tools\.mcp_servers\.gone \(command .*SystemExit\(3\)\): cannot connect: "):
        add_mcp_tools(ToolsSpec.model_validate(tools), [row()])


def test_a_server_spec_names_one_transport():
    with pytest.raises(ValueError, match="exactly one of command"):
        ToolsSpec.model_validate({"mcp_servers": {"x": {"command": ["a"], "url": "http://127.0.0.1:1/mcp"}}})


def test_an_unreachable_server_is_named_with_its_url_and_the_cause():
    """Not the SDK's "ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)"."""
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(
        Exception, match=rf"tools\.mcp_servers\.remote \({re.escape(url)}\): cannot connect: ConnectError"
    ):
        add_mcp_tools(ToolsSpec.model_validate({"mcp_servers": {"remote": {"url": url}}}), [row()])


def test_a_server_gone_mid_job_ends_the_episodes_naming_its_url(tokenizer):
    """Its tools were listed at the start; then it went away: each episode that calls it ends (server_error),
    the message naming the server's URL and the cause; nothing is raised to the job."""
    with serving() as (url, process):
        tools = {"mcp_servers": {"remote": {"url": url, "timeout_s": 10}}}
        examples = with_server_tools(tools, [row()])
        with Episodes(tokenizer, bump_twice, tools, examples) as episodes:
            process.terminate()
            process.wait(timeout=10)
            (group,) = episodes.run(n=2)
    for completion in group:
        kind, message = completion.metadata["tool_failure"]
        assert kind == "server_error" and url in message, message
        assert "ExceptionGroup" not in message and "ConnectError" in message, message


def test_a_server_is_named_without_its_secrets():
    """Errors reach the samples, which a service's tenant reads (a registered server is the operator's)."""
    from openrft.spec.tools import McpServerSpec
    from openrft.tools.mcp import where

    command = ["npx", "server", "--api-key", "XYZ", "--token=abc", "--root", "data"]
    assert where(McpServerSpec(command=command)) == "command npx server --api-key *** --token=*** --root data"
    assert where(McpServerSpec(url="http://127.0.0.1:8000/mcp?token=abc")) == "http://127.0.0.1:8000/mcp"


def test_an_http_server_back_after_a_restart_gets_a_new_session(tokenizer):
    """Gone mid-job: its calls fail (server_error, or timeout); back on its address: the next episodes' calls open a new
    session and are answered, with no restart of the job."""
    port = free_port()
    with serving(port) as (url, process):
        tools = {"mcp_servers": {"remote": {"url": url, "timeout_s": 3}}}
        examples = with_server_tools(tools, [row()])
        with Episodes(tokenizer, bump_twice, tools, examples) as episodes:
            (first,) = episodes.run(n=1)
            process.terminate()
            process.wait(timeout=10)
            (down,) = episodes.run(n=1)
            with serving(port):
                (back,) = episodes.run(n=1)
    assert "tool_failure" not in first[0].metadata and responses(first[0]) == ["bump 1", "bump 2"]
    assert down[0].metadata["tool_failure"][0] in ("server_error", "timeout")  # the SDK may wait for the answer
    assert "tool_failure" not in back[0].metadata and responses(back[0]) == ["bump 1", "bump 2"]  # a new process
