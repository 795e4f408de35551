"""OpenRFT's benchmarks: ``python -m benchmarks`` (or ``make bench``); see docs/performance.md."""

import openrft  # noqa: F401  (first: it sets torch's OpenMP wait policy, which is read when torch loads)
