"""MCP servers the operator registers with the service (``openrft serve --mcp-servers FILE``).

A stdio MCP server runs a command on the service's machine, so only the operator defines one: the file maps
names to servers in the shape of a job's ``tools.mcp_servers`` (``command``, ``env``, ``cwd`` relative to the
file, or ``url``). A tenant's job names one with ``{registered: NAME}``; at submission the service puts the
operator's definition in its place, keeping the ``session`` and ``timeout_s`` the job set.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from openrft.errors import OpenRFTError
from openrft.service.errors import ApiError
from openrft.spec.document_limits import DocumentLimitError, load_yaml
from openrft.spec.errors import problems_from_validation
from openrft.spec.job import JobSpec
from openrft.spec.tools import McpServerSpec, ToolsSpec

TENANT_CHOICES = ("session", "timeout_s")  # what a job may set on a registered server


def load_mcp_servers(path: str | Path) -> dict[str, McpServerSpec]:
    """The servers of an operator's file, each checked; errors name the file and the entry."""
    path = Path(path)
    try:
        document = load_yaml(path.read_text())
    except (OSError, DocumentLimitError, yaml.YAMLError) as exc:
        raise OpenRFTError(f"--mcp-servers {path}: cannot be read: {exc}") from None
    if not isinstance(document, dict):
        raise OpenRFTError(f"--mcp-servers {path}: expected a mapping of server names to servers")
    try:
        tools = ToolsSpec.model_validate({"mcp_servers": document})
    except ValidationError as exc:
        lines = [f"  - {p.path}: {p.message}" for p in problems_from_validation(exc, document, skip=1)]
        raise OpenRFTError(f"--mcp-servers {path}:\n" + "\n".join(lines)) from None
    registered = [name for name, server in tools.mcp_servers.items() if server.registered is not None]
    if registered:
        raise OpenRFTError(f"--mcp-servers {path}: {registered[0]}: give a command or a url, not registered")
    return tools.relative_to(path.resolve().parent).mcp_servers


def resolve_registered(spec: JobSpec, registry: dict[str, McpServerSpec]) -> JobSpec:
    """``spec`` with each ``{registered: NAME}`` server replaced by the operator's; an unknown name is a 400
    listing the registered ones."""
    if spec.tools is None or not any(s.registered for s in spec.tools.mcp_servers.values()):
        return spec
    servers: dict[str, McpServerSpec] = {}
    for name, server in spec.tools.mcp_servers.items():
        if server.registered is None:
            servers[name] = server
            continue
        found = registry.get(server.registered)
        if found is None:
            field = f"openrft.tools.mcp_servers.{name}.registered"
            available = ", ".join(sorted(registry)) or "none (the operator registers them with --mcp-servers)"
            raise ApiError(
                400,
                f"{field}: {server.registered!r} is not an MCP server of this service; registered: {available}",
                "invalid_job",
                field,
            )
        chosen = {key: getattr(server, key) for key in TENANT_CHOICES if key in server.model_fields_set}
        servers[name] = found.model_copy(update=chosen)
    return spec.model_copy(update={"tools": spec.tools.model_copy(update={"mcp_servers": servers})})
