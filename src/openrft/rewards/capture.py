"""What trusted in-process reward code prints, captured per call instead of reaching OpenRFT's stdout.

``sys.stdout`` is swapped, while any capture is active, for a router that sends each write to the
buffer of the capture whose context it runs in (a ``ContextVar``: it follows ``asyncio`` tasks and
``asyncio.to_thread``), and every other write to the real stdout. So two rewards running at once in
different threads each get their own output, and the program's own prints are untouched.
(Sandboxed code is captured by its worker: ``calls/sandbox/worker.py``.)
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

STDOUT_LIMIT = 64 * 1024
_BUFFER: ContextVar[io.StringIO | None] = ContextVar("openrft_reward_stdout", default=None)
_LOCK = threading.Lock()
_ACTIVE = 0


class _Router(io.TextIOBase):
    def __init__(self, real: Any):
        self.real = real

    def write(self, text: str) -> int:
        buffer = _BUFFER.get()
        if buffer is None:
            return self.real.write(text)
        if buffer.tell() < STDOUT_LIMIT:
            buffer.write(text[: STDOUT_LIMIT - buffer.tell()])
        return len(text)

    def flush(self) -> None:
        if _BUFFER.get() is None:
            self.real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@contextmanager
def captured_stdout() -> Iterator[io.StringIO]:
    """Collect what the code run inside (and the threads and tasks it starts) prints."""
    global _ACTIVE
    with _LOCK:
        if not isinstance(sys.stdout, _Router):
            sys.stdout = _Router(sys.stdout)
        _ACTIVE += 1
    buffer = io.StringIO()
    token = _BUFFER.set(buffer)
    try:
        yield buffer
    finally:
        _BUFFER.reset(token)
        with _LOCK:
            _ACTIVE -= 1
            if _ACTIVE == 0 and isinstance(sys.stdout, _Router):
                sys.stdout = sys.stdout.real


REWARD_OUTPUT_FILE = "reward_output.log"
"""In a run directory: what user reward code printed during training, step by step."""


def output_log(step: int, printed: list[tuple[str, str]]) -> str:
    """The log text of one step from ``(sample label, output)`` pairs; empty outputs are left out, and an
    output repeated by the samples of one batch call (a Python callable's) is written once."""
    seen: set[str] = set()
    blocks = []
    for label, text in printed:
        if text and text not in seen:
            seen.add(text)
            blocks.append(f"--- step {step}, {label}\n{text}" + ("" if text.endswith("\n") else "\n"))
    return "".join(blocks)
