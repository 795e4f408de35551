"""OpenRFT: reinforcement fine-tuning of open-weight models on hardware you own."""

import os

# torch's OpenMP runtime (libgomp) keeps idle worker threads spinning between parallel regions. On a
# machine shared with other processes the spinning threads take the cores the working ones need,
# and a training step gets tens of times slower (docs/performance.md, "Threads"). Idle workers
# sleep instead, unless the user chose a policy. This takes effect when openrft is imported before
# torch (the CLI, the job service and the engine's processes all do).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

__version__ = "0.1.0"
