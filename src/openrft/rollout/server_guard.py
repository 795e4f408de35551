"""What keeps ``openrft serve-model`` safe to expose: a bearer key, the directories weights may be loaded
from, per-request caps, and a lock handed over in arrival order.

- **Key**: with ``--api-key`` every route but ``/health`` needs ``Authorization: Bearer KEY`` (401
  otherwise); a server bound to anything but loopback refuses to start without one.
- **Load roots**: ``/v1/load_weights`` and ``/v1/load_lora_adapter`` read only directories that, once
  resolved (symlinks followed), lie under one of the ``--allow-load-from`` directories; none given, every
  load is refused (403). Answers never show a resolved host path.
- **Caps**: a request's samples (prompts × n) and tokens (its prompt tokens plus samples × max_tokens) are
  capped; past a cap, 400 naming it. Token ids outside the vocabulary are 400.
- **Fair lock**: a request generates in chunks (at most ``chunk_sequences`` sequences and ``chunk_tokens``
  new tokens; a prompt's ``n`` samples split over chunks when they are more) and takes the model's lock per
  chunk; the lock goes to waiting requests in arrival order, so no request holds the model for longer than
  one chunk while another waits.
"""

from __future__ import annotations

import hmac
import ipaddress
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK_NAMES = ("localhost",)


class GuardError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServeLimits:
    max_samples: int = 4096  # prompts × n per request
    max_tokens: int = 4 << 20  # prompt tokens + samples × max_tokens per request
    chunk_sequences: int = 64  # sequences generated per turn of the lock
    chunk_tokens: int = 32_768  # new tokens (sequences × max_tokens) per turn of the lock
    load_roots: tuple[Path, ...] = field(default_factory=tuple)  # resolved directories weights may come from

    def __post_init__(self) -> None:
        self.load_roots = tuple(Path(r).resolve() for r in self.load_roots)

    def loadable(self, path: str, param: str) -> Path:
        """``path`` resolved, if it lies under a load root; else GuardError 403 (not showing the roots)."""
        if not self.load_roots:
            raise GuardError(
                403, "loading weights is disabled: the server was started without --allow-load-from", param
            )
        resolved = Path(path).resolve()
        if not any(resolved == root or root in resolved.parents for root in self.load_roots):
            raise GuardError(403, f"{param} {path!r} is not under a directory this server loads from", param)
        return resolved

    def check_request(self, prompts: list[list[int]], n: int, max_new_tokens: int, vocab: int) -> None:
        samples = len(prompts) * n
        if samples > self.max_samples:
            raise GuardError(
                400,
                f"the request asks for {samples:,} samples (prompts × n), more than the cap of {self.max_samples:,} "
                "(--max-samples-per-request)",
                "n",
            )
        tokens = sum(len(p) for p in prompts) + samples * max_new_tokens
        if tokens > self.max_tokens:
            raise GuardError(
                400,
                f"the request asks for {tokens:,} tokens (prompt tokens + samples × max_tokens), more than the cap "
                f"of {self.max_tokens:,} (--max-tokens-per-request)",
                "max_tokens",
            )
        for i, prompt in enumerate(prompts):
            bad = next((t for t in prompt if not 0 <= t < vocab), None)
            if bad is not None:
                raise GuardError(400, f"prompt {i} has token id {bad}, outside the vocabulary [0, {vocab})", "prompt")


def check_stop_ids(stop_token_ids: list[int] | None, vocab: int) -> None:
    bad = next((t for t in stop_token_ids or [] if not 0 <= t < vocab), None)
    if bad is not None:
        message = f"stop_token_ids has token id {bad}, outside the vocabulary [0, {vocab})"
        raise GuardError(400, message, "stop_token_ids")


def key_matches(authorization: str | None, api_key: str) -> bool:
    scheme, _, value = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), api_key.encode())


class FairLock:
    """A lock granted in the order it was asked for (``threading.Lock`` lets a releasing thread take it
    straight back, which would let one chunked request starve the others)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._queue: deque[object] = deque()
        self._held = False

    def acquire(self) -> None:
        ticket = object()
        with self._condition:
            self._queue.append(ticket)
            while self._held or self._queue[0] is not ticket:
                self._condition.wait()
            self._queue.popleft()
            self._held = True

    def release(self) -> None:
        with self._condition:
            self._held = False
            self._condition.notify_all()

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
