"""Fixtures of the spec tests; the job builders live in dialect_builders.py."""

from __future__ import annotations

import pytest
from dialect_builders import write_dataset


@pytest.fixture
def data_dir(tmp_path):
    """A directory with train.jsonl (100 prompts) and val.jsonl (10 prompts)."""
    write_dataset(tmp_path / "train.jsonl", 100)
    write_dataset(tmp_path / "val.jsonl", 10)
    return tmp_path
