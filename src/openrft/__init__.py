"""OpenRFT: reinforcement fine-tuning of open-weight models on hardware you own."""

from __future__ import annotations

import os
from typing import Any

# torch's OpenMP runtime (libgomp) keeps idle worker threads spinning for 300,000 iterations between
# parallel regions. On a machine shared with other processes the spinning threads take the cores the
# working ones need, and a training step gets tens of times slower (docs/performance.md, "Threads"); but
# workers that sleep at once (OMP_WAIT_POLICY=PASSIVE) are woken for each of the thousand small ops of a
# decode step: on Qwen2.5-0.5B's shape, 64 rows, 2 threads, generation ran 22 tokens/s sleeping, 85
# spinning 20,000 iterations, 91 spinning without end. Idle workers spin briefly, then sleep, unless the
# user chose a policy. This takes effect when openrft is imported before torch (the CLI, the job service
# and the engine's processes all do).
SPIN_COUNT = "20000"
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``openrft.Client`` (the job service SDK), imported on first use."""
    if name == "Client":
        from openrft.client import Client

        return Client
    raise AttributeError(f"module 'openrft' has no attribute {name!r}")
