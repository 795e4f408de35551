"""``openrft jobs create|list|get|events|cancel|pause|resume|checkpoints``: the job service from a shell."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from openrft.cli.service_options import add_client_options


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
    for name in ("get", "cancel", "pause", "resume", "checkpoints"):
        actions.add_parser(name, help=f"{name} a job" if name != "checkpoints" else "best checkpoints")
    for action in actions.choices.values():
        if action.prog.split()[-1] in ("get", "cancel", "pause", "resume", "checkpoints"):
            action.add_argument("job_id")
        action.add_argument("--json", action="store_true", help="print the API's JSON")
        add_client_options(action)
    p.set_defaults(handler=run)


def _when(seconds: int | None) -> str:
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S") if seconds else "-"


def _print_job(job, as_json: bool) -> None:
    if as_json:
        print(job.model_dump_json(indent=2))
        return
    error = f"  error: {job.error.code}: {job.error.message}" if job.error else ""
    print(
        f"{job.id}  {job.status:<10}  step {job.step}/{job.total_steps}  {job.model}  created {_when(job.created_at)}"
        f"{'  model ' + job.fine_tuned_model if job.fine_tuned_model else ''}{error}"
    )


def run(args: argparse.Namespace) -> int:
    from openrft.client import Client

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
