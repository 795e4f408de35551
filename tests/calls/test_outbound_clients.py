"""Every HTTP client in the package is made where the outbound policy is applied (``openrft.calls.endpoints``'
``async_client``/``sync_client``, ``openrft.calls.transport``), in the spirit of tests/spec/test_url_fields.py: a
new client made elsewhere, or a new HTTP library, fails here until it goes through them or is listed below with
the reason it is not a job's call to a tenant's address."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "openrft"
CLIENT = re.compile(
    r"\bhttpx2?\.(Async)?Client\(|\bAsyncClient\(|\bhttpx2?\.(get|post|put|delete|request|stream)\("
    r"|\burlopen\(|\burllib\.request\b|\baiohttp\b|\brequests\.(get|post|put|request|Session)\("
    r"|\bhttp\.client\b|\bsocket\.create_connection\(|\bMlflowClient\(|\bstreamablehttp_client\(|\bClient\(\w*\)"
)
POLICY_MODULES = {"calls/endpoints.py", "calls/transport.py"}
NOT_A_JOBS_CALL = {
    ("client.py", "httpx.Client("): "the Python client of OpenRFT's API, run by a person against a server they name",
    ("runtime/cluster_address.py", "socket.create_connection("): "probes the operator's Ray address",
    ("storage.py", "socket.create_connection("): "probes the operator's object-store endpoint",
    ("engine/mlflow_tracking.py", "MlflowClient("): "its sessions go through transport.use_for_mlflow, called first",
    ("service/routes_agents.py", "httpx.AsyncClient("): "the service forwarding to its own job process on 127.0.0.1",
}


def client_constructions() -> list[tuple[str, str, int]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for match in CLIENT.finditer(code):
                found.append((relative, match.group(0), number))
    return found


def test_every_http_client_is_made_where_the_outbound_policy_applies():
    elsewhere = [
        f"{path}:{number}: {what}"
        for path, what, number in client_constructions()
        if path not in POLICY_MODULES and (path, what) not in NOT_A_JOBS_CALL
    ]
    assert elsewhere == [], (
        "make calls out with openrft.calls.endpoints.async_client/sync_client (or a client of "
        "openrft.calls.transport), so that a tenant's job connects only to addresses the outbound policy checked"
    )


def test_the_listed_exceptions_still_exist_and_mlflow_is_routed_first():
    found = {(path, what) for path, what, _ in client_constructions()}
    assert set(NOT_A_JOBS_CALL) <= found  # a stale entry would hide a new client in the same file
    text = (SRC / "engine" / "mlflow_tracking.py").read_text()
    assert text.index("use_for_mlflow()") < text.index("MlflowClient(tracking_uri")
