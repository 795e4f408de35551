"""The example model builders (scripts/build_*_model.py) run twice side by side, for their byte-identity tests."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from tests.processes import run_at_once


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_twice(script: Path, arguments: list[str], a: Path, b: Path, timeout_s: float = 300) -> None:
    """``script arguments --out a`` and ``... --out b`` in two processes at once (two cores: the time of one)."""
    run_at_once([[sys.executable, str(script), *arguments, "--out", str(out)] for out in (a, b)], timeout=timeout_s)
