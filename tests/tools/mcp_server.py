"""A small MCP server for the tests (the official SDK's MCPServer).

- ``add``: stateless; ``refuse``: always an error;
- ``bump``: a counter of this server process (a stdio server process serves one client session);
- ``tally``: a counter per episode, keyed by the ``openrft/episode_id`` that OpenRFT sends in each call's
  ``_meta`` (how a server keeps per-episode state over stateless streamable HTTP), echoing the turn.

    python mcp_server.py stdio
    python mcp_server.py http PORT
"""

from __future__ import annotations

import sys

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


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
