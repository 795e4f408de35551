"""``openrft serve``: the API and a worker in one command (SQLite under the data directory by default)."""

from __future__ import annotations

import argparse
import importlib
import logging
import threading

from openrft.cli.service_options import (
    add_cluster_option,
    add_gpu_options,
    add_store_options,
    apply_gpu_options,
    open_store,
    ray_address,
)
from openrft.cli.tinker_options import add_tinker_options, tinker_settings
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
    add_cluster_option(p)
    add_gpu_options(p)
    p.add_argument("--max-upload-mb", type=int, default=512)
    p.add_argument(
        "--agent-base-url",
        help="the address agents reach this server at (http(s)://HOST:PORT): rollout.agent jobs hand their agents "
        "URL/v1/agent/JOB/TRAJECTORY; unset: the job's own 127.0.0.1 routes (docs/agents.md)",
    )
    p.add_argument(
        "--allow-private-urls",
        action="store_true",
        help="let tenants' URLs (datasets, reward endpoints, generator, MLflow) reach loopback, link-local and "
        "private addresses (refused by default: docs/service.md, Security)",
    )
    p.add_argument(
        "--allow-store-prefix",
        action="append",
        default=[],
        metavar="KEY=PREFIX",
        help="let the tenant of an API key (its id or name; '*': every tenant) name object-store locations "
        "(s3://, gs://, hf://) under PREFIX, reached with this server's credentials (repeatable; none by default)",
    )
    p.add_argument(
        "--mcp-servers",
        metavar="FILE",
        help="MCP servers tenants' jobs may use, by name (YAML: NAME: {command: [...], env, cwd} or {url}); a "
        "tenant names one with tools.mcp_servers.X: {registered: NAME} and never runs a command of its own",
    )
    p.add_argument("--max-queued-jobs", type=int, default=100, help="jobs one API key may have queued (past it, 429)")
    p.add_argument("--max-stored-mb", type=int, default=4096, help="MB of files one API key may store (past it, 413)")
    p.add_argument(
        "--grader-workers-per-key",
        type=int,
        default=4,
        help="of the 8 grader workers, how many one API key's graders/run calls may hold at once",
    )
    p.add_argument(
        "--grader-calls-per-key",
        type=int,
        default=16,
        help="graders/run calls of one API key running or waiting (past it, 429)",
    )
    add_tinker_options(p)
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
    config.ray_address = ray_address(args.ray_address)
    apply_gpu_options(config, args)
    config.max_upload_bytes = args.max_upload_mb << 20
    config.allow_private_urls = args.allow_private_urls
    config.agent_base_url = args.agent_base_url
    config.store_prefixes = store_prefixes(args.allow_store_prefix)
    if args.mcp_servers:
        from openrft.service.mcp_registry import load_mcp_servers

        config.mcp_servers = load_mcp_servers(args.mcp_servers)
    config.max_queued_jobs_per_tenant = _at_least(args.max_queued_jobs, 0, "--max-queued-jobs")
    config.max_stored_mb_per_tenant = _at_least(args.max_stored_mb, 0, "--max-stored-mb")
    config.grader_workers_per_tenant = _at_least(args.grader_workers_per_key, 1, "--grader-workers-per-key")
    config.grader_calls_per_tenant = _at_least(args.grader_calls_per_key, 1, "--grader-calls-per-key")
    config.tinker = tinker_settings(args)
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


def _at_least(value: int, least: int, flag: str) -> int:
    if value < least:
        raise OpenRFTError(f"{flag} {value}: must be at least {least}")
    return value


def store_prefixes(values: list[str]) -> dict[str, tuple[str, ...]]:
    """``KEY=PREFIX`` options -> {key: prefixes}; a prefix must be an object-store URI naming its bucket."""
    from openrft.calls.outbound import STORE_SCHEMES

    found: dict[str, tuple[str, ...]] = {}
    for value in values:
        who, _, prefix = value.partition("=")
        scheme, _, rest = prefix.partition("://")
        if not who or scheme.lower() not in STORE_SCHEMES or not rest.split("/")[0]:
            raise OpenRFTError(
                f"--allow-store-prefix {value!r}: expected KEY=PREFIX, KEY a key's id or name (or '*') and PREFIX "
                f"an object-store location with its bucket ({', '.join(s + '://' for s in STORE_SCHEMES)})"
            )
        found[who] = (*found.get(who, ()), prefix)
    return found
