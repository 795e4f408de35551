"""``openrft serve``'s options for the Tinker API (docs/tinker.md): its bounds per request and the base
models it publishes to tenants."""

from __future__ import annotations

import argparse
from pathlib import Path

from openrft.errors import OpenRFTError
from openrft.models import REGISTERED_MODELS
from openrft.service.tinker.futures import SCHEDULES
from openrft.service.tinker.settings import TinkerSettings

DEFAULTS = TinkerSettings()


def add_tinker_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Tinker API (/api/v1, docs/tinker.md)")
    group.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="publish a base model to tenants under NAME: a local model directory or a Hugging Face Hub id "
        "(repeatable; openrft-demo is always published). A bare HUB_ID publishes it under its own name",
    )
    group.add_argument(
        "--allow-hub-models",
        action="store_true",
        help="let tenants name any Hugging Face Hub id as base_model (the server downloads it; off by default)",
    )
    bounds = (
        (
            "--tinker-max-sequence-tokens",
            "tokens of one sequence: a datum's model_input, a sample's prompt plus max_tokens",
        ),
        ("--tinker-max-call-tokens", "tokens of one forward_backward or forward call, all its datums"),
        ("--tinker-max-num-samples", "num_samples of one sample request"),
        ("--tinker-max-sample-tokens", "tokens of one sample request: num_samples x (prompt + max_tokens)"),
    )
    for flag, what in bounds:
        name = flag.removeprefix("--tinker-").replace("-", "_")
        group.add_argument(flag, type=int, default=getattr(DEFAULTS, name), help=f"the most {what} (past it, 413)")
    caps = (
        ("--tinker-max-training-clients", "live training clients per API key (a finished session's are freed)"),
        ("--tinker-max-sampling-sessions", "sampling sessions (create_sampling_client) per API key"),
    )
    for flag, what in caps:
        name = flag.removeprefix("--tinker-").replace("-", "_")
        group.add_argument(flag, type=int, default=getattr(DEFAULTS, name), help=f"the most {what} (past it, 400)")
    group.add_argument(
        "--tinker-clients-per-actor",
        type=int,
        default=DEFAULTS.clients_per_actor,
        help="with --ray-address: the most training clients and sampling sessions on one node's Tinker actor "
        "(each node has one, the base model loaded once there; past every node's bound, 503)",
    )
    group.add_argument(
        "--tinker-schedule",
        choices=SCHEDULES,
        default=DEFAULTS.schedule,
        help="fair: each API key's calls queue apart and the worker serves the keys in turn, so one key's backlog "
        "never holds another's call (default); fifo: every call in arrival order (to compare against)",
    )
    group.add_argument(
        "--tinker-abandon-after-s",
        type=float,
        default=DEFAULTS.abandon_s,
        metavar="SECONDS",
        help="a client counts as disconnected when it retrieves none of a call's future, or its session sends no "
        "heartbeat (the SDK sends one every 10 s), for this long: its queued calls are dropped and a running "
        "forward_backward stops at its next part",
    )


def tinker_settings(args: argparse.Namespace) -> TinkerSettings:
    settings = TinkerSettings(models=published_models(args.model), allow_hub_models=args.allow_hub_models)
    names = ("max_sequence_tokens", "max_call_tokens", "max_num_samples", "max_sample_tokens")
    for name in (*names, "max_training_clients", "max_sampling_sessions", "clients_per_actor"):
        value = getattr(args, f"tinker_{name}")
        if value < 1:
            raise OpenRFTError(f"--tinker-{name.replace('_', '-')} {value}: must be at least 1")
        setattr(settings, name, value)
    if not args.tinker_abandon_after_s > 0:  # NaN too
        raise OpenRFTError(f"--tinker-abandon-after-s {args.tinker_abandon_after_s}: must be more than 0 seconds")
    settings.schedule, settings.abandon_s = args.tinker_schedule, args.tinker_abandon_after_s
    return settings


def published_models(values: list[str]) -> dict[str, str]:
    """``NAME=PATH`` (or a bare Hub id) options -> {name: directory or Hub id}; a directory must exist."""
    found: dict[str, str] = {}
    for value in values:
        name, sep, source = value.partition("=")
        if not sep:
            source = name
        if not name or not source or name in REGISTERED_MODELS:
            raise OpenRFTError(
                f"--model {value!r}: expected NAME=PATH (a model directory or a Hub id) or a Hub id, with a NAME "
                f"other than {', '.join(REGISTERED_MODELS)}"
            )
        path = Path(source).expanduser()
        if path.is_absolute() or source.startswith((".", "~")):
            if not path.is_dir():
                raise OpenRFTError(f"--model {value!r}: {source} is not a directory")
            source = str(path.resolve())
        found[name] = source
    return found
