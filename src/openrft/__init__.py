"""OpenRFT: reinforcement fine-tuning of open-weight models on hardware you own."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``openrft.Client`` (the job service SDK), imported on first use."""
    if name == "Client":
        from openrft.client import Client

        return Client
    raise AttributeError(f"module 'openrft' has no attribute {name!r}")
