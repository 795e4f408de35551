"""Caps on what a grader computes from its inputs, so that no request makes a process allocate or
compute without bound (one ``graders/run`` call runs inside the API server).

- A filled template (``{{item.x}}`` and friends) is at most ``MAX_RENDERED_CHARS`` characters: a
  template repeating a large field would otherwise multiply it.
- A ``text_similarity`` metric reads at most its cap of each text (``SIMILARITY_CAPS``): tokens for the
  word metrics, characters for ``fuzzy_match``. The algorithms behind them keep no n×m table (rouge-L's
  longest common subsequence is rapidfuzz's bit-parallel one: linear memory, n×m/64 word operations),
  so a call at the caps takes well under a second (``tests/rewards/test_grader_limits.py``).

- A tenant's regular expression (Vertex's ``REGEX_CONTAINS``, ``regexExtractExpression``) is matched by the
  ``regex`` package with a time limit of ``REGEX_TIME_LIMIT_S`` and the GIL released: a catastrophic
  backtracking pattern (``(a+)+$``) would otherwise hold the server's interpreter for hours. Past the
  limit the sample is a ``timeout``. A pattern is at most ``MAX_REGEX_CHARS`` characters once filled (a
  ``{{references.x}}`` placeholder inserts the reference escaped): compiling is not under the time limit,
  and a 400 KB pattern took over 20 s to compile.

Past a cap the sample fails as ``invalid_output`` with the cap named (``RewardFailure.limit``): a job
counts it as an error of that sample, ``graders/run`` answers 400.
"""

from __future__ import annotations

from openrft.rewards.types import RewardFailure
from openrft.spec.rewards import MAX_REGEX_CHARS

MAX_RENDERED_CHARS = 1_000_000

SIMILARITY_CAPS: dict[str, tuple[int, str]] = {
    "fuzzy_match": (100_000, "characters"),
    "bleu": (20_000, "tokens"),
    "gleu": (20_000, "tokens"),
    "meteor": (2_000, "tokens"),
    **{f"rouge_{n}": (20_000, "tokens") for n in "12345l"},
}

REGEX_TIME_LIMIT_S = 1.0


def regex_matches(pattern: str, text: str, what: str) -> list:
    """Every match of a tenant's ``pattern`` in ``text``, in at most ``REGEX_TIME_LIMIT_S``; a pattern that is
    not a regex is ``invalid_output``, one that runs out of time a ``timeout``."""
    import regex

    if len(pattern) > MAX_REGEX_CHARS:
        raise too_large(what, len(pattern), MAX_REGEX_CHARS, "characters", "characters per regex")
    try:
        return list(regex.finditer(pattern, text, concurrent=True, timeout=REGEX_TIME_LIMIT_S))
    except regex.error as exc:
        raise RewardFailure("invalid_output", f"{what} {pattern[:100]!r} is not a regex: {exc}") from None
    except TimeoutError:
        raise RewardFailure(
            "timeout", f"{what} {pattern[:80]!r} ran past {REGEX_TIME_LIMIT_S:g} s on {len(text):,} characters"
        ) from None


def too_large(what: str, size: int, cap: int, unit: str, limit: str) -> RewardFailure:
    return RewardFailure(
        "invalid_output", f"{what} has {size:,} {unit}, more than the cap of {cap:,} ({limit})", limit=limit
    )


def check_similarity_input(metric: str, which: str, size: int) -> None:
    """RewardFailure naming the cap when ``which`` text (input or reference) is past ``metric``'s cap."""
    cap, unit = SIMILARITY_CAPS[metric]
    if size > cap:
        raise too_large(f"text_similarity {metric} {which}", size, cap, unit, f"{metric} {unit} per text")
