"""Exceptions a user can cause. Each message names the field or line, the value, and what is allowed."""

from __future__ import annotations


class OpenRFTError(Exception):
    """Base class of errors caused by user input or environment, shown without a traceback."""


class ModelNotFoundError(OpenRFTError):
    """A model name or path that does not resolve to a loadable model."""


class RewardError(OpenRFTError):
    """A reward configuration that cannot be built, or a reward that fails the job."""


class CheckpointError(OpenRFTError):
    """A run directory or checkpoint that cannot be resumed from."""
