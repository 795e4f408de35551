"""Options shared by the service commands: where the store lives, and how to reach a server."""

from __future__ import annotations

import argparse


def add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="files, runs and the SQLite database (default: $OPENRFT_HOME or ~/.openrft)")
    parser.add_argument(
        "--database-url",
        help="e.g. postgresql://user@host/db (default: $OPENRFT_DATABASE_URL, else SQLite in the data directory)",
    )


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", help="the server (default: $OPENRFT_BASE_URL or http://127.0.0.1:8000)")
    parser.add_argument("--api-key", help="default: $OPENRFT_API_KEY")


def open_store(args: argparse.Namespace):
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    config = ServiceConfig.build(args.data_dir, args.database_url)
    return config, Store.open(config.database_url)
