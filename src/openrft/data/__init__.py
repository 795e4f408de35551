"""Datasets: records, loading with line-numbered validation, and resumable batching."""

from openrft.data.loader import DatasetError, LineProblem, load_dataset, split_validation
from openrft.data.records import Example
from openrft.data.sampler import EpochSampler

__all__ = ["DatasetError", "EpochSampler", "Example", "LineProblem", "load_dataset", "split_validation"]
