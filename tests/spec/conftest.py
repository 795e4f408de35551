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


@pytest.fixture(autouse=True)
def no_aws_credentials(monkeypatch, tmp_path):
    """No AWS credentials from this machine's environment, files or instance metadata: a Lambda ARN is then
    refused with the mapping hint instead of being invoked."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
