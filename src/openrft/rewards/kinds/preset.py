"""Preset rewards: ``exact_match`` and ``numeric_match``.

Both read the reference from ``reference_answer``: a string is used as it is; an object is read
at its ``answer``, ``solution`` or ``ground_truth`` key, or its only value.

- ``exact_match``: 1 when the completion equals the reference after trimming both ends and
  collapsing every run of whitespace to one space; case matters. Otherwise 0.
- ``numeric_match``: 1 when the last number in the completion (``-1,234.5`` style: sign, thousands
  commas, decimals) equals the reference's number within a relative tolerance of 1e-6. A
  completion with no number scores 0; a reference with no number is an ``invalid_output`` error.
"""

from __future__ import annotations

import math
import re
from typing import Any

from openrft.rewards.kinds import Needs
from openrft.rewards.types import RewardContext, RewardFunction, RewardOutcome, RewardSample
from openrft.spec.rewards import PresetReward, RewardSpec

CONFIG = PresetReward

_WS = re.compile(r"\s+")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
REFERENCE_KEYS = ("answer", "solution", "ground_truth")


def reference_text(reference: Any) -> str | None:
    if isinstance(reference, str):
        return reference
    if isinstance(reference, int | float) and not isinstance(reference, bool):
        return str(reference)
    if isinstance(reference, dict):
        for key in REFERENCE_KEYS:
            if key in reference:
                return reference_text(reference[key])
        if len(reference) == 1:
            return reference_text(next(iter(reference.values())))
    return None


def normalise_whitespace(text: str) -> str:
    return _WS.sub(" ", text).strip()


def last_number(text: str) -> float | None:
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return float(matches[-1].replace(",", ""))


class _Preset:
    requires_reference = True
    name = "preset"

    async def score(self, samples: list[RewardSample]) -> list[RewardOutcome]:
        return [self._score_one(s) for s in samples]

    def _score_one(self, sample: RewardSample) -> RewardOutcome:
        reference = reference_text(sample.example.reference_answer)
        if reference is None:
            return RewardOutcome.failure(
                "invalid_output",
                f"example {sample.example.id}: reference_answer has no text to compare "
                f"(a string, or an object with one of {', '.join(REFERENCE_KEYS)})",
            )
        return self.compare(sample.completion, reference)

    def compare(self, completion: str, reference: str) -> RewardOutcome:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


class ExactMatch(_Preset):
    name = "exact_match"

    def compare(self, completion: str, reference: str) -> RewardOutcome:
        return RewardOutcome(score=float(normalise_whitespace(completion) == normalise_whitespace(reference)))


class NumericMatch(_Preset):
    name = "numeric_match"

    def compare(self, completion: str, reference: str) -> RewardOutcome:
        expected = last_number(reference)
        if expected is None:
            return RewardOutcome.failure("invalid_output", f"reference_answer {reference[:100]!r} holds no number")
        got = last_number(completion)
        correct = got is not None and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
        return RewardOutcome(score=float(correct))


PRESETS = {"exact_match": ExactMatch, "numeric_match": NumericMatch}


def build(config: PresetReward, spec: RewardSpec, context: RewardContext) -> RewardFunction:
    return PRESETS[config.name]()


def needs(config: PresetReward) -> Needs:
    return Needs()
