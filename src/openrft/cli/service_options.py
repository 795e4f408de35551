"""Options shared by the service commands: where the store lives, and how to reach a server."""

from __future__ import annotations

import argparse
import re

from openrft.errors import OpenRFTError

RAY_ADDRESS = re.compile(r"(auto|(ray://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5})")


def add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="files, runs and the SQLite database (default: $OPENRFT_HOME or ~/.openrft)")
    parser.add_argument(
        "--database-url",
        help="e.g. postgresql://user@host/db (default: $OPENRFT_DATABASE_URL, else SQLite in the data directory)",
    )


def add_cluster_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="run every job on this Ray cluster (auto: the cluster this machine belongs to; HOST:PORT of the "
        "head's GCS; ray://HOST:10001): its learners and generation replicas become Ray actors there "
        "(docs/scaling.md, 'The service on a Ray cluster'); default: each job runs in its job process",
    )


def add_gpu_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpus",
        default="auto",
        help="without --ray-address: this machine's GPUs the workers give jobs, each job its own (auto: those "
        "nvidia-smi lists, within CUDA_VISIBLE_DEVICES; none; or indices/UUIDs such as 0,1,3)",
    )
    parser.add_argument(
        "--jobs-per-gpu", type=int, default=1, help="jobs that may share one GPU (default 1: never two jobs on one)"
    )


def apply_gpu_options(config, args: argparse.Namespace) -> None:
    """``--gpus`` and ``--jobs-per-gpu`` into the config (ignored with a cluster: Ray places GPUs there)."""
    from openrft.service.devices import parse_gpus

    if args.jobs_per_gpu < 1:
        raise OpenRFTError(f"--jobs-per-gpu {args.jobs_per_gpu}: must be at least 1")
    config.gpus = [] if config.ray_address else parse_gpus(args.gpus)
    config.jobs_per_gpu = args.jobs_per_gpu


def ray_address(value: str | None) -> str | None:
    """``--ray-address`` checked: ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``."""
    if value is None:
        return None
    if not RAY_ADDRESS.fullmatch(value):
        raise OpenRFTError(
            f"--ray-address {value!r}: expected auto, HOST:PORT (the head node's GCS, e.g. 10.0.0.5:6379) or "
            "ray://HOST:PORT (Ray Client, e.g. ray://head:10001)"
        )
    return value


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", help="the server (default: $OPENRFT_BASE_URL or http://127.0.0.1:8000)")
    parser.add_argument("--api-key", help="default: $OPENRFT_API_KEY")


def open_store(args: argparse.Namespace):
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    config = ServiceConfig.build(args.data_dir, args.database_url)
    return config, Store.open(config.database_url)
