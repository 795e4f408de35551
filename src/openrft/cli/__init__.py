"""The ``openrft`` command line. Each subcommand lives in its own module with a ``register`` function."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from openrft.errors import OpenRFTError

COMMAND_MODULES = ("train", "evaluate", "plot", "spec", "rewards", "serve_model", "serve", "worker", "keys", "jobs")


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="openrft", description="Reinforcement fine-tuning of open-weight models.")
    from openrft import __version__

    parser.add_argument("--version", action="version", version=f"openrft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"openrft.cli.{name}").register(sub)
    return parser


def quiet_libraries() -> None:
    """Keep library progress bars and deprecation chatter out of the command's own output."""
    import logging
    import warnings

    for name in ("gcsfs", "s3fs", "aiobotocore", "botocore", "fsspec", "google.auth"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # their retry tracebacks; our errors name the URI
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*TRANSFORMERS_VERBOSITY.*")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries()
    try:
        return int(args.handler(args) or 0)
    except OpenRFTError as exc:
        console = Console(stderr=True, soft_wrap=True)
        console.print("error:", style="bold red", end=" ")
        console.print(str(exc), markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
