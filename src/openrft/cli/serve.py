"""``openrft serve``: the API and a worker in one command (SQLite under the data directory by default)."""

from __future__ import annotations

import argparse
import importlib
import logging
import threading

from openrft.cli.service_options import add_store_options, open_store
from openrft.errors import OpenRFTError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the job service: OpenAI/Vertex-compatible API and a worker")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (beyond loopback needs an API key)")
    p.add_argument("--port", type=int, default=8000)
    add_store_options(p)
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="jobs the embedded worker runs at once (0: none; run `openrft worker` processes instead)",
    )
    p.add_argument("--heartbeat-timeout", type=float, default=30.0, help="seconds before a silent job is requeued")
    p.add_argument("--max-upload-mb", type=int, default=512)
    p.add_argument(
        "--allow-private-urls",
        action="store_true",
        help="let tenants' URLs (datasets, reward endpoints, generator, MLflow) reach loopback, link-local and "
        "private addresses (refused by default: docs/service.md, Security)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from openrft.service.app import create_app
    from openrft.service.config import LOOPBACK_HOSTS
    from openrft.service.worker import Worker, start_in_thread

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, store = open_store(args)
    config.host = args.host
    config.heartbeat_timeout_s = args.heartbeat_timeout
    config.max_upload_bytes = args.max_upload_mb << 20
    config.allow_private_urls = args.allow_private_urls
    if args.host not in LOOPBACK_HOSTS and not store.any_keys():
        raise OpenRFTError(
            f"refusing to serve on {args.host} without an API key: create one with "
            "`openrft keys create` (or bind to 127.0.0.1)"
        )
    from openrft.calls.sandbox.mechanism import enforcement_gaps

    for gap in enforcement_gaps():
        logging.getLogger("openrft.sandbox").warning("not enforced: %s", gap)
    app = create_app(config, store)
    # the first job submission needs the engine's modules (torch): import them while the server starts
    threading.Thread(target=importlib.import_module, args=("openrft.engine.setup",), daemon=True).start()
    worker_thread = stop = None
    if args.workers > 0:
        worker_thread, stop = start_in_thread(Worker(store, config, concurrency=args.workers))
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    try:
        server.run()
    finally:
        if stop is not None and worker_thread is not None:
            stop.set()
            worker_thread.join(timeout=30)
        store.close()
    return 0
