"""Where a Nova/Bedrock reward Lambda runs: a published handler file in the sandbox, or AWS Lambda itself.

Both take the Lambda's event (a list of samples, ``kinds.nova_lambda.nova_entry``) and return what the handler
returned; ``kinds.nova_lambda.NovaLambdaFunction`` batches and matches the results. The HTTP transport is
``calls.endpoints.RemoteEndpoint.post_json``.

A handler file runs unchanged: ``lambda_handler(event, context)`` is called in the sandbox with a
context object like AWS's (``aws_request_id``, ``function_name``, ``invoked_function_arn``,
``memory_limit_in_mb``, ``get_remaining_time_in_millis()`` counting down the sandbox time limit, ...).
The shim that builds it is appended to the file's source, so the user's line numbers stay as they are.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from openrft.calls.sandbox import SandboxPool
from openrft.rewards.types import RewardFailure

SHIM_ENTRY = "__openrft_lambda_entry__"
CONTEXT_SHIM = '''

def __openrft_lambda_entry__(event, fields, handler_name):
    import time as _openrft_time

    class LambdaContext:
        """What AWS Lambda passes as ``context`` (the Python runtime's LambdaContext attributes)."""

        def __init__(self, fields):
            self.__dict__.update(fields)
            self._deadline = _openrft_time.monotonic() + fields["time_limit_s"]
            self.identity = None
            self.client_context = None

        def get_remaining_time_in_millis(self):
            return max(0, int((self._deadline - _openrft_time.monotonic()) * 1000))

        def log(self, message):
            print(message)

    return globals()[handler_name](event, LambdaContext(fields))
'''


def split_handler(target: str) -> tuple[Path, str]:
    path, _, function = target.rpartition(":")
    return Path(path), function


def context_fields(function_name: str, time_limit_s: float, memory_limit_mb: int) -> dict[str, Any]:
    return {
        "aws_request_id": str(uuid.uuid4()),
        "function_name": function_name,
        "function_version": "$LATEST",
        "invoked_function_arn": f"arn:aws:lambda:local:000000000000:function:{function_name}",
        "memory_limit_in_mb": str(memory_limit_mb),
        "log_group_name": f"/aws/lambda/{function_name}",
        "log_stream_name": f"openrft/{function_name}",
        "time_limit_s": time_limit_s,
    }


class HandlerInvoker:
    """A ``path.py:lambda_handler`` file (``source``: its text, read by the caller), invoked in the sandbox pool."""

    def __init__(self, target: str, source: str, pool: SandboxPool, time_limit_s: float):
        path, self.handler = split_handler(target)
        self.source = source + CONTEXT_SHIM
        self.function_name = path.stem
        self.label = f"reward Lambda {path.name}:{self.handler}"
        self.pool = pool
        self.time_limit_s = time_limit_s

    async def invoke(self, event: list[dict[str, Any]]) -> Any:
        fields = context_fields(self.function_name, self.time_limit_s, self.pool.spec.memory_limit_mb)
        result = await self.pool.call(self.source, SHIM_ENTRY, [event, fields, self.handler], self.time_limit_s)
        if not result.ok:
            raise RewardFailure(result.kind, f"{self.label}: {result.message}")  # type: ignore[arg-type]
        return result.value


class AwsLambdaInvoker:
    """An AWS Lambda invoked through boto3 (``RequestResponse``), with the event as its JSON payload."""

    def __init__(self, arn: str, time_limit_s: float):
        import boto3
        from botocore.config import Config

        region = arn.split(":")[3]
        config = Config(read_timeout=time_limit_s, connect_timeout=10, retries={"max_attempts": 2})
        self.client = boto3.client("lambda", region_name=region, config=config)
        self.arn = arn
        self.label = f"AWS Lambda {arn}"

    def _invoke(self, event: list[dict[str, Any]]) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.invoke(
                FunctionName=self.arn, InvocationType="RequestResponse", Payload=json.dumps(event).encode("utf-8")
            )
        except ClientError as exc:
            raise RewardFailure("server_error", f"{self.label}: {exc}") from None
        except BotoCoreError as exc:
            raise RewardFailure("server_error", f"{self.label}: {type(exc).__name__}: {exc}") from None
        body = response["Payload"].read()
        if response.get("FunctionError"):
            raise RewardFailure("runtime_error", f"{self.label} raised: {body[:300].decode('utf-8', 'replace')}")
        try:
            return json.loads(body)
        except ValueError:
            raise RewardFailure("invalid_output", f"{self.label} answered a payload that is not JSON") from None

    async def invoke(self, event: list[dict[str, Any]]) -> Any:
        return await asyncio.to_thread(self._invoke, event)
