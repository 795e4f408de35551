"""A small MCP server for the tests (the official SDK's MCPServer).

- ``add``: stateless; ``refuse``: always an error;
- ``bump``: a counter of this server process (a stdio server process serves one client session);
- ``tally``: a counter per episode, keyed by the ``openrft/episode_id`` that OpenRFT sends in each call's
  ``_meta`` (how a server keeps per-episode state over stateless streamable HTTP), echoing the turn.

A second server, ``calculator`` (stdio), offers only the calculator example's ``calculator`` tool; with
``--die-after N`` its process exits (as if killed) at its call N + 1, before answering it.

    python mcp_server.py stdio
    python mcp_server.py http PORT
    python mcp_server.py calculator [--die-after N]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("openrft-test-tools")
COUNTS: dict[str, int] = {}


@server.tool(description="Adds two integers")
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description="Counts the calls this server process has served")
def bump() -> str:
    COUNTS["process"] = COUNTS.get("process", 0) + 1
    return f"bump {COUNTS['process']}"


@server.tool(description="Counts the calls of this episode")
def tally(ctx: Context) -> str:
    meta = dict(ctx.request_context.meta or {})
    episode = meta.get("openrft/episode_id", "none")
    COUNTS[episode] = COUNTS.get(episode, 0) + 1
    return f"tally {COUNTS[episode]} turn {meta.get('openrft/turn')}"


@server.tool(description="Always fails")
def refuse(reason: str) -> str:
    raise ToolError(f"refused: {reason}")


calculator_server = MCPServer("openrft-test-calculator")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "calculator"))
from calculator import calculator as evaluate  # noqa: E402 (the example's tool)


@calculator_server.tool(description="Evaluates an arithmetic expression")
def calculator(expression: str) -> str:
    COUNTS["calculator"] = COUNTS.get("calculator", 0) + 1
    if "--die-after" in sys.argv and COUNTS["calculator"] > int(sys.argv[sys.argv.index("--die-after") + 1]):
        os._exit(1)  # killed: no answer, the connection closes
    return evaluate(expression)


if __name__ == "__main__":
    if sys.argv[1:2] == ["calculator"]:
        calculator_server.run()
    elif sys.argv[1:2] == ["http"]:
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
