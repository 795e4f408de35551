"""The example model builders (scripts/build_*_model.py) run twice side by side, for their byte-identity tests."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_twice(script: Path, arguments: list[str], a: Path, b: Path, timeout_s: float = 300) -> None:
    """``script arguments --out a`` and ``... --out b`` in two processes at once (two cores: the time of one)."""
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), *arguments, "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for out in (a, b)
    ]
    for process in processes:
        _, err = process.communicate(timeout=timeout_s)
        assert process.returncode == 0, err.decode()[-2000:]
