"""``openrft keys create|list|revoke``: API keys of the job service (each key is its own tenant)."""

from __future__ import annotations

import argparse

from openrft.cli.service_options import add_store_options, open_store
from openrft.errors import OpenRFTError

TINKER_PREFIX = "tml-"  # the Tinker SDK refuses a key without it; the server strips it (docs/tinker.md)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="manage the job service's API keys")
    actions = p.add_subparsers(dest="keys_action", required=True)
    create = actions.add_parser("create", help="create a key and print it (shown once)")
    create.add_argument("--name", default="default")
    create.add_argument(
        "--tinker",
        action="store_true",
        help="print the key as the Tinker SDK takes it (with the tml- prefix the SDK requires: TINKER_API_KEY)",
    )
    add_store_options(create)
    listing = actions.add_parser("list", help="list keys (ids and prefixes, never the secrets)")
    add_store_options(listing)
    revoke = actions.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("key_id")
    add_store_options(revoke)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    _, store = open_store(args)
    try:
        if args.keys_action == "create":
            key, secret = store.create_key(args.name)
            print(TINKER_PREFIX + secret if args.tinker else secret)
            import sys

            print(f"created {key.id} ({key.name}); the key is shown only now", file=sys.stderr)
            if not args.tinker:
                print(f"for the Tinker SDK (TINKER_API_KEY): {TINKER_PREFIX}<this key>", file=sys.stderr)
        elif args.keys_action == "list":
            for key in store.list_keys():
                state = "revoked" if key.revoked_at else "active"
                print(f"{key.id}\t{key.prefix}…\t{key.name}\t{state}")
        elif not store.revoke_key(args.key_id):
            raise OpenRFTError(f"no active key {args.key_id!r}")
    finally:
        store.close()
    return 0
