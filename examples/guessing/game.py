"""The guessing game of the example: a number from 1 to 15 hidden in the dataset row, found with ``guess(n)``.

An OpenRFT environment (``tools.environment`` in recipe.yaml, docs/tools.md): one ``NumberGame`` per episode,
``reset`` with the row (its ``reference_answer`` is the secret; every row shows the model the same prompt),
``step`` per call. A wrong guess is answered with ``higher LO-HI`` or ``lower LO-HI`` (the range still
possible); the right one with ``correct``, which ends the episode, as does the last wrong guess allowed
(``guesses`` in the config, 4 by default). ``reward``: 1 when the number was found, else 0.
scripts/build_guess_model.py plays its pre-training games with this class too.
"""

from __future__ import annotations

from openrft.tools.runners import Step

LOW, HIGH, GUESSES = 1, 15, 4


class NumberGame:
    def __init__(self, config: dict):
        self.low, self.high = int(config.get("low", LOW)), int(config.get("high", HIGH))
        self.allowed = int(config.get("guesses", GUESSES))

    def reset(self, row: dict) -> None:
        self.secret = int(row["reference_answer"])
        self.lo, self.hi = self.low, self.high
        self.guesses: list[int] = []
        self.found = False

    def step(self, name: str, arguments: dict) -> str | Step:
        if name != "guess":
            raise ValueError(f"no tool {name}; call guess(n)")
        n = arguments.get("n")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"n is {n!r}: a whole number from {self.low} to {self.high}")
        self.guesses.append(n)
        if n == self.secret:
            self.found = True
            return Step("correct", done=True)
        if n < self.secret:
            self.lo = max(self.lo, n + 1)
            hint = f"higher {self.lo}-{self.hi}"
        else:
            self.hi = min(self.hi, n - 1)
            hint = f"lower {self.lo}-{self.hi}"
        if len(self.guesses) >= self.allowed:
            return Step(f"{hint}; no guesses left", done=True)
        return hint

    def reward(self) -> float:
        return 1.0 if self.found else 0.0

    def state(self) -> dict:
        return {"secret": self.secret, "guesses": self.guesses, "found": self.found}
