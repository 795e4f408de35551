"""``/v1/agent/{job_id}/...``: a running job's agent routes (``tools.agent_routes``), reached through the service.

The job's process serves them on 127.0.0.1 and writes where (port, token) in its run directory
(``tools.agent_runtime.ADDRESS_FILE``); this route forwards a request there, the answer streamed back as it
comes (a streaming Sample's events included). It is let through for the key of the tenant that owns the job,
or for the job's own token (what the job hands its agent with each trajectory); anyone else's key gets the
404 of a job that does not exist.
"""

from __future__ import annotations

import hmac
import json
import re
from pathlib import Path

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from openrft.service.errors import ApiError
from openrft.service.store import NotFound
from openrft.tools.agent_runtime import ADDRESS_FILE

router = APIRouter(prefix="/v1/agent", tags=["agents"])
JOB_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
FORWARDED_HEADERS = ("content-type", "accept")


def _address(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / ADDRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


def _bearer(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


@router.post("/{job_id}/{rest:path}", include_in_schema=False)
async def forward(job_id: str, rest: str, request: Request):
    app = request.app
    if not JOB_ID.match(job_id):
        raise NotFound(job_id)
    job = await run_in_threadpool(app.state.store.get_job, None, job_id)
    address = _address(app.state.config.runs_dir / job_id)
    token = _bearer(request)
    if not (address and token and hmac.compare_digest(token, str(address.get("token", "")))):
        owner = await run_in_threadpool(app.state.auth.owner, request.headers.get("authorization"))
        if owner != job.owner:
            raise NotFound(job_id)
    if address is None or job.status != "running":
        raise ApiError(
            409,
            f"job {job_id} serves no agent routes now (it is {job.status}; rollout.agent jobs "
            "serve them while they run)",
            "agent_routes_unavailable",
        )
    client = httpx.AsyncClient(timeout=None)
    headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
    headers["authorization"] = f"Bearer {address['token']}"
    upstream = client.build_request(
        "POST",
        f"http://127.0.0.1:{int(address['port'])}/v1/agent/{job_id}/{rest}",
        headers=headers,
        content=await request.body(),
    )
    try:
        response = await client.send(upstream, stream=True)
    except httpx.HTTPError:
        await client.aclose()
        raise ApiError(
            409, f"job {job_id} does not answer on its agent routes (it may be ending)", "agent_routes_unavailable"
        ) from None

    async def close() -> None:
        await response.aclose()
        await client.aclose()

    kept = {k: v for k, v in response.headers.items() if k.lower() in ("content-type",)}
    return StreamingResponse(
        response.aiter_raw(), status_code=response.status_code, headers=kept, background=BackgroundTask(close)
    )
