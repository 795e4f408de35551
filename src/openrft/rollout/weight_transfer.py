"""Which way a full-rank policy reaches a vLLM server: vLLM's weight-transfer routes, or files it reloads.

vLLM 0.32 serves training weight-transfer routes beside its development-mode RPC (``VLLM_SERVER_DEV_MODE=1``,
``vllm/entrypoints/rl/online/api_router.py``): ``POST /init_weight_transfer_engine {"init_info"}`` once, then per
update ``POST /start_weight_update``, ``POST /update_weights {"update_info"}`` per chunk and ``POST
/finish_weight_update {"weight_version"}``; ``GET /weight_info`` reads the served version. The tensors themselves do
not travel over HTTP: ``update_info`` describes them (names, dtypes, shapes) and the backend configured at the
server's start (``--weight-transfer-config '{"backend": ...}'``) moves them. Its backends (``nccl``, ``ipc``,
``sparse_nccl``, ``nccl_m2n``, ``sharded_rdt``, ``modelexpress``) all move tensors between CUDA devices: on vLLM-CPU
the ``nccl`` backend's ``init_weight_transfer_engine`` fails with HTTP 500 "Cannot access accelerator device when
none is available" (``nccl_common.worker_init_process_group``; measured, docs/scaling.md), and without a
configured backend every route answers 500 "Weight transfer not configured".

OpenRFT does not drive those backends yet, so the choice below always ends on the file path (``weight_files.py`` +
``reload_weights`` through ``/collective_rpc``); it is made once per server, by what the server answers, and logged
with its reason, so that the route path can take over where a backend can run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import torch

log = logging.getLogger("openrft.rollout")

ROUTES = "routes"
FILES = "files"


def backend_here() -> tuple[str | None, str]:
    """A weight-transfer backend this process can drive, or None and why not."""
    if not torch.cuda.is_available():
        return None, (
            "vLLM's weight-transfer backends (nccl, ipc, sparse_nccl, nccl_m2n, sharded_rdt, modelexpress) move "
            "tensors between CUDA devices, and this learner has none"
        )
    return None, "OpenRFT does not drive vLLM's NCCL weight-transfer backend yet"


def choose_full_weights_path(get: Callable[[str], httpx.Response], root: str) -> tuple[str, str]:
    """``(ROUTES or FILES, reason)`` for the server at ``root``: the routes when it has them (``GET /weight_info``)
    and a backend can run here, else the files. ``get`` returns the response whatever its status."""
    try:
        status = get(f"{root}/weight_info").status_code
    except httpx.HTTPError as exc:
        return FILES, f"GET {root}/weight_info failed ({type(exc).__name__}: {exc})"
    if status in (404, 405):
        reason = f"the server has no weight-transfer routes (GET /weight_info answered {status})"
    elif status >= 400:
        reason = f"GET /weight_info answered {status}"
    else:
        backend, why = backend_here()
        if backend is not None:
            return ROUTES, f"the server has the weight-transfer routes and the {backend} backend runs here"
        reason = f"the server has the weight-transfer routes, but {why}"
    return FILES, reason


def log_choice(root: str, path: str, reason: str) -> None:
    how = "vLLM's weight-transfer routes" if path == ROUTES else "safetensors files + reload_weights (collective_rpc)"
    log.info("full weights reach %s by %s: %s", root, how, reason)
