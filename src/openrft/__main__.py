"""``python -m openrft``: the command line (so that ``torchrun -m openrft train JOB`` starts a sharded job)."""

from openrft.cli import main

raise SystemExit(main())
