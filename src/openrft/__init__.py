"""OpenRFT: reinforcement fine-tuning of open-weight models on hardware you own."""

from __future__ import annotations

import os
from typing import Any

# torch's OpenMP runtime (libgomp) keeps idle worker threads spinning for 300,000 iterations between
# parallel regions. On a machine shared with other processes the spinning threads take the cores the
# working ones need, and a training step gets tens of times slower (docs/performance.md, "Threads").
# Idle workers sleep instead, unless the user chose a policy. Sleeping costs a 0.5B model's decode step
# most of its second thread (22 against 85 tokens/s with GOMP_SPINCOUNT=20000 on 2 threads), but with a
# short spin as the default a tool test with 2 s timeouts failed in CI, so it stays the user's choice
# (docs/performance.md, "At the size people train"). This takes effect when openrft is imported before
# torch (the CLI, the job service and the engine's processes all do).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``openrft.Client`` (the job service SDK), imported on first use."""
    if name == "Client":
        from openrft.client import Client

        return Client
    raise AttributeError(f"module 'openrft' has no attribute {name!r}")
