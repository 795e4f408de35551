"""The tools benchmark's calculator: the example's ``calculator`` after a latency of 0 to ``MAX_LATENCY_S``
seconds, fixed per expression (the same latencies in every schedule measured)."""

from __future__ import annotations

import importlib.util
import random
import time
from pathlib import Path

MAX_LATENCY_S = 2.0
_SOURCE = Path(__file__).resolve().parent.parent / "examples" / "calculator" / "calculator.py"
_spec = importlib.util.spec_from_file_location("calculator_example", _SOURCE)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)


def latency_s(expression: str) -> float:
    return random.Random(expression).uniform(0.0, MAX_LATENCY_S)


def calculator(expression: str) -> str:
    time.sleep(latency_s(str(expression)))
    return _module.calculator(expression)
