"""``openrft worker``: run queued jobs from the store (as many of these as you like, on any machine that
sees the same database and data directory)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from openrft.cli.service_options import (
    add_cluster_option,
    add_gpu_options,
    add_store_options,
    apply_gpu_options,
    open_store,
    ray_address,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run queued jobs of the job service")
    add_store_options(p)
    add_cluster_option(p)
    add_gpu_options(p)
    p.add_argument("--concurrency", type=int, default=1, help="jobs run at once, each in its own process")
    p.add_argument("--heartbeat-timeout", type=float, default=30.0, help="seconds before a silent job is requeued")
    p.add_argument("--poll-interval", type=float, default=0.5)
    p.add_argument(
        "--agent-base-url",
        help="the address agents reach this server at (http(s)://HOST:PORT): rollout.agent jobs hand their agents "
        "URL/v1/agent/JOB/TRAJECTORY; unset: the job's own 127.0.0.1 routes (docs/agents.md)",
    )
    p.add_argument(
        "--spawn",
        action="store_true",
        help="start each job in a fresh interpreter instead of forking this worker (which imports the engine once)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from openrft.service.launchers import ForkLauncher, SpawnLauncher
    from openrft.service.worker import Worker

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, store = open_store(args)
    config.heartbeat_timeout_s = args.heartbeat_timeout
    config.poll_interval_s = args.poll_interval
    config.ray_address = ray_address(args.ray_address)
    apply_gpu_options(config, args)
    config.agent_base_url = args.agent_base_url
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # a worker on a Ray cluster is a Ray driver (admission): a process holding Ray's connection must not fork
        spawn = args.spawn or config.ray_address is not None
        launcher = SpawnLauncher(config) if spawn else ForkLauncher(config, store.engine)
        Worker(store, config, concurrency=args.concurrency, launcher=launcher).run(stop)
    finally:
        store.close()
    return 0
