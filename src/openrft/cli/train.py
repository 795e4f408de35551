"""``openrft train JOB_FILE --output DIR`` and ``openrft train --resume DIR``."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from openrft.cli.spec import add_mapping_options, resolve_from_args
from openrft.errors import OpenRFTError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="run an RFT job from a Nova recipe, Vertex request or OpenAI job file")
    p.add_argument("job", nargs="?", help="the job file (YAML or JSON, any dialect)")
    p.add_argument(
        "--output",
        "-o",
        help="run directory; takes precedence over the job's output location (default: the job's output "
        "location, else runs/NAME)",
    )
    p.add_argument(
        "--staging",
        metavar="DIR",
        help="with an s3:// or gs:// output location: the local run directory uploaded to it (default runs/NAME)",
    )
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its latest checkpoint")
    p.add_argument("--dialect", choices=["nova", "vertex", "openai", "canonical"], help="skip detection")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    p.add_argument("--steps", type=int, help="override the number of training steps")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_mapping_options(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from openrft.runtime.torchrun import follow, is_follower

    if is_follower():  # a torchrun rank > 0: a shard of the learner, driven by rank 0's job
        return follow()
    from openrft.engine import RFTJob
    from openrft.runtime import runtime_factory, runtime_for
    from openrft.spec.locations import is_remote, resolve_location

    on_event = event_printer(args.quiet)
    if args.resume:
        job = RFTJob.from_run_dir(
            args.resume, runtime_factory=runtime_factory(on_event), show_progress=not args.quiet, on_event=on_event
        )
    else:
        if not args.job:
            raise OpenRFTError("openrft train needs a job file, or --resume RUN_DIR")
        resolution = resolve_from_args(args)
        for warning in resolution.warnings:
            print(f"warning: {warning}")
        spec = resolution.spec
        if args.steps:
            spec.training.total_steps = args.steps
        remote = spec.output_dir if spec.output_dir and is_remote(spec.output_dir) else None
        local = None if remote else resolve_location(spec.output_dir, Path.cwd())  # a path or file:// URI
        if args.staging and not remote:
            raise OpenRFTError("--staging is for a job whose output location is s3:// or gs://; use --output DIR")
        run_dir = Path(args.output or args.staging or local or Path("runs") / spec.name)
        if remote:
            print(f"training in {run_dir}; outputs are uploaded to {remote}")
        if run_dir.exists() and any(run_dir.iterdir()):
            if not args.overwrite:
                raise OpenRFTError(f"run directory {run_dir} is not empty: pass --overwrite, or --resume {run_dir}")
            if not (run_dir / "spec.json").exists():
                raise OpenRFTError(f"{run_dir} is not an OpenRFT run directory; --overwrite only replaces runs")
            shutil.rmtree(run_dir)
        job = RFTJob(
            spec, run_dir, show_progress=not args.quiet, runtime=runtime_for(spec, on_event), on_event=on_event
        )
    summary = job.run()
    return 0 if summary["status"] in ("succeeded", "paused") else 1


def event_printer(quiet: bool):
    """The run's events (the layouts chosen, checkpoints, a learner process lost, rewards that failed) on stderr,
    where the progress bar is: warnings always, the rest unless ``--quiet``."""
    import sys

    def on_event(level: str, message: str) -> None:
        if level != "info" or not quiet:
            print(f"{level}: {message}", file=sys.stderr, flush=True)

    return on_event
