"""The tools benchmark's slow tools: the calculator example's ``calculator`` and the guessing example's
``NumberGame``, each answering after a latency of 0 to ``MAX_LATENCY_S`` seconds that is fixed by the call
(the expression; the game's secret, guess count and guess), so every schedule measured meets the same
latencies for the same calls."""

from __future__ import annotations

import importlib.util
import random
import time
from pathlib import Path

MAX_LATENCY_S = 2.0
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_calculator = _example_module(EXAMPLES / "calculator" / "calculator.py")
_game = _example_module(EXAMPLES / "guessing" / "game.py")


def latency_s(key: str) -> float:
    return random.Random(key).uniform(0.0, MAX_LATENCY_S)


def calculator(expression: str) -> str:
    time.sleep(latency_s(str(expression)))
    return _calculator.calculator(expression)


class SlowNumberGame(_game.NumberGame):
    """The guessing example's game, each guess answered after its latency."""

    def step(self, name: str, arguments: dict):
        time.sleep(latency_s(f"{self.secret}:{len(self.guesses)}:{arguments.get('n')}"))
        return super().step(name, arguments)
