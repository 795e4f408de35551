"""The RFT engine: the training loop, evaluation, checkpoints and resume, the metrics sink.

``RFTJob`` and its controls load on first use: the job service's store reads ``engine.samples`` and
``engine.metrics``, and a command such as ``openrft keys create`` must not import torch for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openrft.engine.job import JobControl, RFTJob, StopAfter

__all__ = ["JobControl", "RFTJob", "StopAfter"]


def __getattr__(name: str):
    if name in __all__:
        from openrft.engine import job

        return getattr(job, name)
    raise AttributeError(f"module 'openrft.engine' has no attribute {name!r}")
