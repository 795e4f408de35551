"""``openrft keys create|list|revoke``: API keys of the job service (each key is its own tenant)."""

from __future__ import annotations

import argparse

from openrft.cli.service_options import add_store_options, open_store
from openrft.errors import OpenRFTError

UNCHANGED = object()  # a quota option not given keeps its value
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
    quota = actions.add_parser(
        "quota",
        help="set a key's quota of CPU- and GPU-seconds (its jobs' reservations x running time), or list every "
        "tenant's use and quota (no KEY)",
    )
    quota.add_argument("key", nargs="?", help="a key's id or name, or '*' for every key without a quota of its own")
    for resource in ("cpu", "gpu"):
        quota.add_argument(
            f"--{resource}-seconds",
            type=_seconds,
            default=UNCHANGED,
            help=f"{resource.upper()}-seconds its jobs may reserve ('none': no limit; default: as it is)",
        )
    quota.add_argument("--reset", action="store_true", help="count its use from now on")
    quota.add_argument("--remove", action="store_true", help="remove its quota (then '*''s applies, if any)")
    add_store_options(quota)
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
        elif args.keys_action == "quota":
            set_quota(store, args)
        elif not store.revoke_key(args.key_id):
            raise OpenRFTError(f"no active key {args.key_id!r}")
    finally:
        store.close()
    return 0


def _seconds(value: str) -> float | None:
    """``--cpu-seconds``/``--gpu-seconds``: a number of seconds, at least 0, or ``none``."""
    if value.lower() == "none":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a number of seconds, at least 0, or none")
    return seconds


def tenant_of(store, key: str) -> str:
    """The tenant a quota is for: ``*``, the local user (``local``), or a key by its id or its name."""
    from openrft.service.auth import LOCAL_OWNER
    from openrft.service.store.usage import EVERY_TENANT

    if key in (EVERY_TENANT, LOCAL_OWNER):
        return key
    keys = store.list_keys()
    found = [k for k in keys if k.id == key] or [k for k in keys if k.name == key and not k.revoked_at]
    if len(found) != 1:
        what = "no key" if not found else f"{len(found)} active keys named"
        raise OpenRFTError(f"quota: {what} {key!r}; name a key by its id (openrft keys list), its name, or '*'")
    return found[0].id


def set_quota(store, args: argparse.Namespace) -> None:
    """Set, reset or remove one tenant's quota; without a key, print every tenant's use and quota."""
    from openrft.service.quotas import report, tenants

    changes = args.cpu_seconds is not UNCHANGED or args.gpu_seconds is not UNCHANGED or args.reset or args.remove
    if args.key is None:
        if changes:
            raise OpenRFTError("quota: name the key whose quota to change (its id, its name, or '*' for every key)")
        print("tenant\tCPU-seconds used/limit\tGPU-seconds used/limit\tquota")
        for tenant in tenants(store):
            row = report(store, tenant)
            print(f"{tenant}\t{_pair(row['cpu_seconds'])}\t{_pair(row['gpu_seconds'])}\t{row['set_for'] or 'none'}")
        return
    owner = tenant_of(store, args.key)
    if args.remove:
        if not store.remove_quota(owner):
            raise OpenRFTError(f"quota: {args.key!r} has no quota of its own")
        print(f"removed the quota of {owner}")
        return
    current = next((q for q in store.quotas() if q.owner == owner), None)
    cpu = (current.cpu_seconds if current else None) if args.cpu_seconds is UNCHANGED else args.cpu_seconds
    gpu = (current.gpu_seconds if current else None) if args.gpu_seconds is UNCHANGED else args.gpu_seconds
    store.set_quota(owner, cpu, gpu, reset=args.reset)
    counted = ", use counted from now" if args.reset else ""
    print(f"quota of {owner}: {_limit(cpu, 'CPU')}, {_limit(gpu, 'GPU')}{counted}")


def _limit(value: float | None, what: str) -> str:
    return f"no limit on {what}-seconds" if value is None else f"{value:g} {what}-seconds"


def _pair(entry: dict) -> str:
    limit = "-" if entry["limit"] is None else f"{entry['limit']:g}"
    return f"{entry['used']:.0f}/{limit}"
