"""Rollouts: the generator protocol and its engines.

The protocol's types load on first use: ``openrft serve-model``'s argument parsing reads
``rollout.server_guard``, and the CLI must not import torch to print its help or create a key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openrft.rollout.types import Completion, Generator, SamplingParams

__all__ = ["Completion", "Generator", "SamplingParams"]


def __getattr__(name: str):
    if name in __all__:
        from openrft.rollout import types

        return getattr(types, name)
    raise AttributeError(f"module 'openrft.rollout' has no attribute {name!r}")
