"""``openrft rewards test|validate``: try a reward on one example, or check a reward configuration."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("rewards", help="try or check a reward configuration")
    commands = parser.add_subparsers(dest="rewards_command", required=True)
    test = commands.add_parser("test", help="score one response against one example")
    test.add_argument(
        "config",
        help="a reward config (OpenAI grader, Vertex reward config, reward spec), a job file, or a published "
        "reward Lambda file as reward.py:lambda_handler",
    )
    test.add_argument("--example", required=True, help="a JSON file holding one dataset line")
    source = test.add_mutually_exclusive_group(required=True)
    source.add_argument("--response", help="the model's response text")
    source.add_argument("--response-file", help="a file holding the response text")
    test.add_argument("--step", type=int, default=0, help="the step number the reward sees")
    test.add_argument("--json", action="store_true", help="print the outcome as JSON")
    test.set_defaults(handler=run_test)
    validate = commands.add_parser("validate", help="check a reward configuration without scoring")
    validate.add_argument("config")
    validate.add_argument("--json", action="store_true", help="print {valid, problems} as JSON")
    validate.set_defaults(handler=run_validate)


def _example(path: str):
    from openrft.errors import OpenRFTError
    from openrft.rewards.validation import example_from_line
    from openrft.textlines import LinesUnreadable, decode

    if not Path(path).is_file():
        raise OpenRFTError(f"--example {path}: no such file")
    try:
        text = decode(Path(path).read_bytes())
    except LinesUnreadable as exc:
        raise OpenRFTError(f"--example {path}" + (f":{exc.line}" if exc.line else "") + f": {exc.reason}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        obj = json.loads(text) if len(lines) != 1 or text.strip().startswith("{\n") else json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise OpenRFTError(f"--example {path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    return example_from_line(obj, path)


def run_test(args: argparse.Namespace) -> int:
    from openrft.rewards.kinds.openai_graders import run_view
    from openrft.rewards.kinds.vertex import validate_view
    from openrft.rewards.validation import outcome_json, score_once
    from openrft.spec.dialects import load_reward_spec

    spec = load_reward_spec(args.config)
    example = _example(args.example)
    response = args.response if args.response is not None else Path(args.response_file).read_text(encoding="utf-8")
    outcome = score_once(spec, example, response, args.step)
    if outcome.stdout and not args.json:
        print(f"--- the reward code printed ---\n{outcome.stdout.rstrip()}\n---", file=sys.stderr)
    if not args.json:
        for warning in outcome.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {
                    **outcome_json(outcome),
                    "vertex": validate_view(spec, outcome),
                    "openai": run_view(spec, outcome),
                }
            )
        )
    elif outcome.ok:
        subs = ", ".join(f"{k} {v:.4g}" for k, v in outcome.sub_scores.items())
        print(f"score {outcome.score:.6g}" + (f" ({subs})" if subs else ""))
    else:
        print(f"error {outcome.error_kind}: {outcome.error_message}")
    return 0 if outcome.ok else 1


def run_validate(args: argparse.Namespace) -> int:
    from openrft.rewards.validation import validate
    from openrft.spec.dialects import load_reward_spec
    from openrft.spec.errors import SpecError

    try:
        problems = validate(load_reward_spec(args.config))
    except SpecError as exc:
        problems = exc.problems
    if args.json:
        print(json.dumps({"valid": not problems, "problems": [str(p) for p in problems]}))
    elif problems:
        print(f"{len(problems)} problem(s) in {args.config}:")
        for problem in problems:
            print(f"  - {problem}")
    else:
        print(f"{args.config}: valid")
    return 0 if not problems else 2
