"""The RFT engine: the training loop, evaluation, checkpoints and resume, the metrics sink."""

from openrft.engine.job import JobControl, RFTJob, StopAfter

__all__ = ["JobControl", "RFTJob", "StopAfter"]
