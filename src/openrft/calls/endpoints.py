"""HTTP calls to the outside (reward endpoints, judges, tools): per-attempt timeouts, retries with backoff,
and a circuit breaker.

Each attempt has a total deadline (``timeout_s``, the body included) and a byte cap on the answer
(``MAX_RESPONSE_BYTES``; tools' own, smaller): past the cap, ``invalid_output``.

Transient failures (connection refused/reset/dropped, a timeout, HTTP 408, 429 or 5xx) are retried
with exponential backoff and jitter. A call that still fails is a ``timeout`` (its last attempt
timed out) or a ``server_error``; a 4xx answer is a ``server_error`` at once, and a body that is not
JSON an ``invalid_output`` (neither is retried: asking again gives the same answer).

The circuit: ``circuit_failures`` calls in a row that end in ``timeout`` or ``server_error`` mean
the endpoint is down; the call that sees it raises ``EndpointDown`` (a RewardError), which fails
the job with a message naming the endpoint and the last error. Any successful call closes it again.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import httpx

from openrft.calls.failures import CallFailure
from openrft.calls.outbound import OutboundPolicy, OutboundRefused, process_policy, redirect_refusal
from openrft.errors import RewardError
from openrft.spec.call_options import RemoteCallSpec

T = TypeVar("T")
TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}
MAX_RESPONSE_BYTES = 16 << 20
"""The most of an answer read from a reward endpoint (a Nova Lambda's batch of metrics fits many times over)."""


class EndpointDown(RewardError):
    """An endpoint failed ``circuit_failures`` calls in a row: the job cannot go on."""


class RemoteEndpoint:
    """One URL called with JSON POSTs under a RemoteCallSpec; shares an httpx client."""

    def __init__(
        self,
        url: str,
        spec: RemoteCallSpec,
        default_timeout_s: float,
        label: str,
        client: httpx.AsyncClient,
        headers: dict[str, str] | None = None,
        kind: str = "reward endpoint",
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        answers_4xx: bool = False,
    ):
        self.url = url
        self.answers_4xx = answers_4xx  # a 4xx is the endpoint's answer (shown to a model), not it being down
        self.max_response_bytes = max_response_bytes
        self.kind = kind
        self.spec = spec
        self.timeout_s = spec.timeout_s or default_timeout_s
        self.label = label
        self.client = client
        self.headers = dict(headers or {})
        if spec.api_key_env and os.environ.get(spec.api_key_env):
            self.headers.setdefault("Authorization", f"Bearer {os.environ[spec.api_key_env]}")
        self.consecutive_failures = 0
        self.failing_keys: set[str] = set()  # the inputs of the failures in a row (``post_json``'s key)
        self.calls = 0
        self.retries = 0
        self._down: str | None = None

    def _backoff(self, attempt: int) -> float:
        delay = min(self.spec.backoff_max_s, self.spec.backoff_initial_s * 2**attempt)
        return delay * (0.5 + random.random() / 2)

    async def post_json(self, payload: Any, key: str | None = None) -> Any:
        """The decoded JSON answer, or CallFailure; EndpointDown when the circuit opens.

        ``key`` names the call's input (a tool call's dataset row): with keys, the circuit opens only when the
        failures in a row come from at least ``min(circuit_failures, 3)`` different inputs, so one input that
        always fails is that input's error, not an endpoint down for everyone."""
        if self._down:
            raise EndpointDown(self._down)
        self.calls += 1
        failure: CallFailure | None = None
        for attempt in range(self.spec.max_retries + 1):
            if attempt:
                self.retries += 1
                await asyncio.sleep(self._backoff(attempt - 1))
            failure, retry, body = await self._attempt(payload)
            if failure is None:
                self.consecutive_failures = 0
                self.failing_keys.clear()
                return body
            if not retry:
                break
        assert failure is not None
        answered = self.answers_4xx and failure.status is not None and 400 <= failure.status < 500
        if failure.kind in ("timeout", "server_error") and not answered:
            self.consecutive_failures += 1
            if key is not None:
                self.failing_keys.add(key)
            spread = key is None or len(self.failing_keys) >= min(self.spec.circuit_failures, 3)
            if self.consecutive_failures >= self.spec.circuit_failures and spread:
                inputs = f" for {len(self.failing_keys)} different inputs" if key is not None else ""
                self._down = (
                    f"{self.kind} {self.label} {self.url} is down: {self.consecutive_failures} calls in a row "
                    f"failed{inputs} after {self.spec.max_retries} retries each; last: {failure.kind}: "
                    f"{failure.message}"
                )
                raise EndpointDown(self._down)
        raise failure

    async def _attempt(self, payload: Any) -> tuple[CallFailure | None, bool, Any]:
        try:
            return await self._attempt_once(payload)
        except UnsendablePayload as exc:
            return CallFailure("invalid_output", f"{self.label}: {exc}"), False, None

    async def _attempt_once(self, payload: Any) -> tuple[CallFailure | None, bool, Any]:
        """One POST within ``timeout_s`` in all (connect, send, headers and the whole body: httpx's own timeout
        is per read, so a server trickling a byte a second would never time out) and at most
        ``max_response_bytes`` read (past it, ``invalid_output``, not retried)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                status, body = await self._read(payload)
        except OutboundRefused as exc:  # asking again reaches the same address
            return CallFailure("server_error", f"{self.label}: {exc}"), False, None
        except (TimeoutError, httpx.TimeoutException):
            return CallFailure("timeout", f"{self.label} did not answer within {self.timeout_s:g} s"), True, None
        except httpx.TransportError as exc:
            return CallFailure("server_error", f"{self.label}: {type(exc).__name__}: {exc}"), True, None
        except ResponseTooLarge:
            message = f"{self.label} answered more than the cap of {self.max_response_bytes:,} bytes"
            return CallFailure("invalid_output", message, status=413), False, None
        if status >= 400:
            text = body[:200].decode("utf-8", "replace")
            failure = CallFailure("server_error", f"{self.label} answered HTTP {status}: {text}", status=status)
            return failure, status in TRANSIENT_STATUS, None
        try:
            return None, False, json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser recurses
            snippet = body[:120].decode("utf-8", "replace")
            return (
                CallFailure("invalid_output", f"{self.label} answered a body that is not JSON: {snippet!r}"),
                False,
                None,
            )

    async def _read(self, payload: Any) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", **(self.headers or {})}
        request = self.client.build_request(
            "POST", self.url, content=request_body(payload), headers=headers, timeout=self.timeout_s
        )
        response = await self.client.send(request, stream=True)
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_response_bytes:
                raise ResponseTooLarge
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise ResponseTooLarge
                chunks.append(chunk)
            return response.status_code, b"".join(chunks)
        finally:
            await response.aclose()


class ResponseTooLarge(Exception):
    """An endpoint's answer passed the endpoint's byte cap."""


class UnsendablePayload(Exception):
    """A payload JSON cannot carry (NaN or infinite numbers, nesting past the encoder's recursion)."""


def request_body(payload: Any) -> bytes:
    """``payload`` as JSON bytes. Non-ASCII characters are sent as ``\\u`` escapes, so that a lone surrogate
    (which a request's JSON may hold, and UTF-8 cannot encode) travels as valid JSON instead of raising."""
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode("ascii")
    except ValueError:
        raise UnsendablePayload("the request holds a number JSON cannot carry (NaN or Infinity)") from None
    except RecursionError:
        raise UnsendablePayload("the request nests deeper than JSON encoding recurses") from None


async def gather_all(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Run concurrently; the first exception cancels the rest and is raised as itself (not a group)."""
    tasks: list[asyncio.Task] = []
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_as_coroutine(a)) for a in awaitables]
    except BaseExceptionGroup as grouped:
        raise _first(grouped) from None
    return [t.result() for t in tasks]


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _first(grouped: BaseExceptionGroup) -> BaseException:
    for exc in grouped.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        if isinstance(exc, RewardError):
            return exc
    inner = grouped.exceptions[0]
    return _first(inner) if isinstance(inner, BaseExceptionGroup) else inner


class Timer:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


TRANSPORT_OPTIONS = ("verify", "cert", "http1", "http2")


def _transport_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The client options its transport holds (a client given a transport ignores its own): moved there."""
    return {name: kwargs.pop(name) for name in TRANSPORT_OPTIONS if name in kwargs}


def _policy(operator: bool, policy: OutboundPolicy | None) -> OutboundPolicy | None:
    return None if operator else (policy or process_policy())


# Every HTTP client a job calls out with is made by these two (or ``openrft.calls.transport`` for the MCP SDK's and
# MLflow's libraries): in a tenant's job they connect only to addresses the outbound policy checked at call time
# (``transport``); tests/calls/test_outbound_clients.py fails when a client is made anywhere else.


def async_client(
    *, operator: bool = False, policy: OutboundPolicy | None = None, limits: httpx.Limits | None = None, **kwargs: Any
) -> httpx.AsyncClient:
    """An httpx.AsyncClient for a job's calls out (make it inside the event loop that uses it). It follows only
    the redirects ``outbound.redirect_refusal`` allows; in a tenant's job it connects only to checked addresses.
    ``operator``: the endpoint is the operator's own (a tenant cannot set it). ``policy``: instead of this
    process's (tests)."""
    checked = _policy(operator, policy)
    limits = limits or httpx.Limits(max_connections=512, max_keepalive_connections=64)
    hooks = {"response": [_refuse_inward_redirects]}
    if checked is not None:
        from openrft.calls.transport import async_transport

        transport = async_transport(checked, limits=limits, **_transport_options(kwargs))
        kwargs.update(transport=transport, trust_env=False)
    kwargs.setdefault("follow_redirects", True)
    return httpx.AsyncClient(limits=limits, event_hooks=hooks, **kwargs)


def sync_client(
    *, operator: bool = False, policy: OutboundPolicy | None = None, limits: httpx.Limits | None = None, **kwargs: Any
) -> httpx.Client:
    """``async_client``'s blocking twin (a generation server's client, MLflow's reachability probe)."""
    checked = _policy(operator, policy)
    limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
    hooks = {"response": [_refuse_inward_redirects_sync]}
    if checked is not None:
        from openrft.calls.transport import sync_transport

        transport = sync_transport(checked, limits=limits, **_transport_options(kwargs))
        kwargs.update(transport=transport, trust_env=False)
    kwargs.setdefault("follow_redirects", True)
    return httpx.Client(limits=limits, event_hooks=hooks, **kwargs)


class RedirectRefused(httpx.TransportError):
    """A redirect the outbound policy does not follow (``openrft.calls.outbound.redirect_refusal``)."""


def _redirect_problem(response: httpx.Response) -> RedirectRefused | None:
    if not response.has_redirect_location:
        return None
    source = str(response.request.url)
    target = str(response.request.url.join(response.headers["location"]))
    reason = redirect_refusal(source, target)
    return RedirectRefused(f"{source} {reason}", request=response.request) if reason else None


async def _refuse_inward_redirects(response: httpx.Response) -> None:
    if response.has_redirect_location and (problem := await asyncio.to_thread(_redirect_problem, response)):
        raise problem


def _refuse_inward_redirects_sync(response: httpx.Response) -> None:
    if problem := _redirect_problem(response):
        raise problem
