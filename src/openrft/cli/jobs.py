"""``openrft jobs create|list|get|events|cancel|pause|resume|checkpoints|samples``: the job service from a shell
(``samples`` also reads a local run directory)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from openrft.cli.service_options import add_client_options
from openrft.errors import OpenRFTError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="submit and follow jobs on an OpenRFT server")
    actions = p.add_subparsers(dest="jobs_action", required=True)
    create = actions.add_parser("create", help="submit a job file (Nova recipe, Vertex or OpenAI JSON)")
    create.add_argument("job_file")
    create.add_argument("--dialect", choices=["nova", "vertex", "openai"])
    listing = actions.add_parser("list", help="list jobs, newest first")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--after", help="the last job id of the previous page")
    events = actions.add_parser("events", help="a job's events, oldest first")
    events.add_argument("job_id")
    events.add_argument("--follow", "-f", action="store_true", help="keep printing until the job finishes")
    samples = actions.add_parser(
        "samples", help="a job's recorded samples: prompt, response, reward, graders (a job id or a run directory)"
    )
    samples.add_argument("job_id", metavar="JOB", help="a job id on the server, or a local run directory")
    samples.add_argument("--kind", choices=["train", "eval"])
    samples.add_argument("--step", type=int)
    samples.add_argument("--example", dest="example_id", help="one prompt's answers (its example id)")
    samples.add_argument("--error-kind", help="samples whose reward failed with this kind ('any': every one)")
    samples.add_argument("--grader", help="samples this grader scored")
    samples.add_argument("--min-reward", type=float)
    samples.add_argument("--max-reward", type=float)
    samples.add_argument(
        "--order",
        choices=["step", "-step", "reward", "-reward", "advantage", "-advantage"],
        help="default: step (as recorded); '-' first is descending, written --order=-reward",
    )
    samples.add_argument("--limit", type=_at_least_one, default=None, help="at most this many (default: all)")
    for name in ("get", "cancel", "pause", "resume", "checkpoints"):
        actions.add_parser(name, help=f"{name} a job" if name != "checkpoints" else "best checkpoints")
    for action in actions.choices.values():
        if action.prog.split()[-1] in ("get", "cancel", "pause", "resume", "checkpoints"):
            action.add_argument("job_id")
        action.add_argument(
            "--json", action="store_true", help="print the API's JSON (samples: one JSON object per line)"
        )
        add_client_options(action)
    p.set_defaults(handler=run)


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def _when(seconds: int | None) -> str:
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S") if seconds else "-"


def _print_job(job, as_json: bool) -> None:
    if as_json:
        print(job.model_dump_json(indent=2))
        return
    error = f"  error: {job.error.code}: {job.error.message}" if job.error else ""
    waiting = f"  ({job.queue_reason})" if job.queue_reason else ""  # on the server's Ray cluster: what it waits for
    print(
        f"{job.id}  {job.status:<10}  step {job.step}/{job.total_steps}  {job.model}  created {_when(job.created_at)}"
        f"{'  model ' + job.fine_tuned_model if job.fine_tuned_model else ''}{error}{waiting}"
    )


def _print_sample(record: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(record, ensure_ascii=False), flush=True)
        return
    from openrft.engine.samples import flat_row

    row = flat_row(record)
    reward = "-" if row["reward"] is None else f"{row['reward']:.3f}"
    advantage = "" if row["advantage"] is None else f"  advantage {row['advantage']:+.3f}"
    error = f"  error {row['error_kind']}" if row["error_kind"] else ""
    print(
        f"{row['kind']:<5} step {row['step']:<4} example {row['example_id']} #{row['sample_index']}  "
        f"reward {reward}{advantage}  age {row['policy_age']}{error}  {row['graders']}"
    )
    print(f"  prompt:   {_one_line(row['prompt'])}")
    print(f"  response: {_one_line(row['response'])}")
    if row["explanations"]:
        print(f"  graders:  {_one_line(row['explanations'])}")


def _one_line(text: str, width: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _samples(args: argparse.Namespace) -> int:
    """Samples from a local run directory, else from the server."""
    from itertools import islice
    from pathlib import Path

    filters = {
        "kind": args.kind,
        "step": args.step,
        "example_id": args.example_id,
        "error_kind": args.error_kind,
        "grader": args.grader,
        "min_reward": args.min_reward,
        "max_reward": args.max_reward,
    }
    run_dir = Path(args.job_id)
    if run_dir.is_dir():
        from openrft.engine.samples import matches, ordered, read_samples

        if not (run_dir / "spec.json").exists():
            raise OpenRFTError(f"{run_dir} is not an OpenRFT run directory (no spec.json)")
        records = ordered([r for r in read_samples(run_dir) if matches(r, **filters)], args.order or "step")
        for record in records[: args.limit]:
            _print_sample(record, args.json)
        return 0
    from openrft.client import Client

    with Client(args.base_url, args.api_key) as client:
        for record in islice(client.iter_samples(args.job_id, order=args.order or "step", **filters), args.limit):
            _print_sample(record, args.json)
    return 0


def run(args: argparse.Namespace) -> int:
    from openrft.client import Client

    if args.jobs_action == "samples":
        return _samples(args)
    with Client(args.base_url, args.api_key) as client:
        action = args.jobs_action
        if action == "create":
            _print_job(client.create_job(args.job_file, args.dialect), args.json)
        elif action == "list":
            page = client.list_jobs(args.limit, args.after)
            if args.json:
                print(page.model_dump_json(indent=2))
            for job in [] if args.json else page.data:
                _print_job(job, False)
        elif action == "events":
            stream = client.follow_events(args.job_id) if args.follow else client.new_events(args.job_id)
            for event in stream:
                if args.json:
                    print(event.model_dump_json())
                else:
                    print(f"{_when(event.created_at)}  {event.level:<5}  {event.message}", flush=True)
        elif action == "checkpoints":
            checkpoints = client.list_checkpoints(args.job_id)
            if args.json:
                print(json.dumps([c.model_dump() for c in checkpoints], indent=2))
            for c in [] if args.json else checkpoints:
                print(
                    f"{c.id}  step {c.step_number}  valid reward {c.metrics.get('valid_reward_mean')}  "
                    f"{c.fine_tuned_model_checkpoint}"
                )
        else:
            job = {
                "get": client.get_job,
                "cancel": client.cancel_job,
                "pause": client.pause_job,
                "resume": client.resume_job,
            }[action](args.job_id)
            _print_job(job, args.json)
    return 0
