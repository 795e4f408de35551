"""A reward Lambda named by a job (Nova recipe, Bedrock request, Bedrock's OpenAI-compatible job) -> what
OpenRFT calls: a local handler file, an HTTP endpoint, or the AWS Lambda itself.

The job stays as published: its ARN is mapped to a local target by ``openrft.lambda_map`` or the CLI's
``--map-lambda ARN=TARGET`` (``--map-lambda TARGET`` maps the job's one Lambda, even a blank one). A
target is ``path.py:function`` (a published ``lambda_handler(event, context)`` file, run in the sandbox)
or an ``http(s)://`` URL (a server taking the Lambda's event as a JSON POST). An unmapped ARN is
invoked through boto3 when AWS credentials are configured; otherwise it is one problem saying what to map.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from openrft.spec.dialects.builder import SpecBuilder
from openrft.spec.dialects.common import build_reward
from openrft.spec.rewards import NovaLambdaReward

ANY_LAMBDA = "*"
LAMBDA_ARN = re.compile(r"^arn:aws[a-z-]*:lambda:[a-z0-9-]+:\d{12}:function:[\w-]+(:[\w$-]+)?$")
HANDLER = re.compile(r"^(?P<path>.+\.py):(?P<function>[A-Za-z_]\w*)$")


def aws_credentials_available() -> bool:
    """Whether boto3 is installed and finds credentials (environment, profile files, SSO, instance role)."""
    try:
        import boto3
    except ImportError:
        return False
    try:
        return boto3.Session().get_credentials() is not None
    except Exception:  # a broken profile file is "no credentials" here; boto3 reports it when invoked
        return False


def resolve_handler(target: str, base_dir: Path) -> str | None:
    """``path.py:function`` with the path made absolute (relative to the job file), else None."""
    match = HANDLER.match(target)
    if not match:
        return None
    path = Path(match["path"]).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    return f"{path.resolve()}:{match['function']}"


def map_advice(arn: str | None) -> str:
    key = f"{arn}=" if arn else ""
    return (
        f"map it to a local handler or endpoint with --map-lambda '{key}reward.py:lambda_handler' "
        f"(a file, or an http:// URL), or openrft.lambda_map"
    )


def lambda_target(b: SpecBuilder, arn: str | None, field: str, mapping: dict[str, str], base_dir: Path) -> str | None:
    """What the job's Lambda ``arn`` (None when blank) resolves to, or None with a problem recorded."""
    target = mapping[arn] if arn and arn in mapping else mapping.get(ANY_LAMBDA)
    origin = target is not None
    if target is None:
        if not arn:
            b.problem(
                field, f"is blank: the job names no reward Lambda; {map_advice(None)}", remedy="--map-lambda HANDLER"
            )
            return None
        target = arn
    handler = resolve_handler(target, base_dir)
    if handler is not None and not origin:
        b.problem(field, "is a handler file: name it in openrft.lambda_map (or --map-lambda), not here", target)
        return None
    if handler is not None:
        if not Path(handler.rsplit(":", 1)[0]).is_file():
            b.problem(field, f"maps to {target!r}, but that file does not exist", *([arn] if arn else []))
            return None
        return handler
    if re.match(r"^https?://[^/\s]+", target):
        return target
    if target.startswith("arn:"):
        if LAMBDA_ARN.match(target) and aws_credentials_available():
            return target
        what = "maps to an AWS Lambda" if origin else "is an AWS Lambda"
        if not LAMBDA_ARN.match(target):
            why = "an ARN template (fill in region, account and function, or map it)"
        else:
            why = "no AWS credentials are configured to invoke it"
        remedy = None if origin else f"--map-lambda '{arn}=HANDLER'"  # the job's own Lambda: map it to run here
        b.problem(field, f"{what}, and {why}: {map_advice(arn)}", *([arn] if arn else []), remedy=remedy)
        return None
    b.problem(field, "is not a Lambda ARN, a handler file (path.py:lambda_handler) or an http(s) URL", target)
    return None


def lambda_reward(
    b: SpecBuilder, arn: str | None, field: str, mapping: dict[str, str], base_dir: Path, **call: Any
) -> NovaLambdaReward | None:
    """The reward config for the job's Lambda, recorded at ``field``; None (with a problem) if it cannot be."""
    target = lambda_target(b, arn, field, mapping, base_dir)
    if target is None:
        return None
    config = build_reward(b, NovaLambdaReward, field, endpoint=target, **call)
    if config is not None:
        note = f"{arn!r} mapped by openrft.lambda_map" if arn and target != arn else None
        b.set("reward.function", config, "user", field, note)
    return config
