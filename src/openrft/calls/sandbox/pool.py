"""A pool of sandboxed worker processes that run user functions with a time limit per call.

A call takes an idle worker (starting one when fewer than ``workers`` exist), sends the source,
the entry point and the arguments, and waits at most the time limit. A worker that passes it is
killed with its whole sandbox and replaced; so is one that runs out of memory or dies. The pool
keeps serving either way: a failed call is an outcome (``timeout`` or ``runtime_error``), never an
exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import struct
import tempfile
from dataclasses import dataclass
from typing import Any

from openrft.calls.sandbox import mechanism
from openrft.calls.sandbox.mechanism import Cgroup
from openrft.errors import RewardError
from openrft.spec.call_options import SandboxSpec

START_TIMEOUT_S = 60.0
LIMIT_WORDS = {
    "memory": "the sandbox went past its memory limit of {spec.memory_limit_mb} MB",
    "processes": "the sandbox reached its limit of {spec.max_processes} processes",
    "scratch": "the sandbox's scratch directory is full: it holds {spec.scratch_limit_mb} MB",
}


@dataclass
class CallResult:
    value: Any = None
    kind: str | None = None
    message: str | None = None
    stdout: str = ""
    limit: str | None = None  # the limit that ended the call: time, memory, processes, scratch, output

    @property
    def ok(self) -> bool:
        return self.kind is None


class SandboxUnavailable(RewardError):
    """Strict isolation was asked for and cannot run on this machine; ``reason`` says why and what to do."""

    def __init__(self, reason: str):
        super().__init__(f"cannot run user code in a sandbox: {reason}")
        self.reason = reason


class _OutputTooLarge(Exception):
    pass


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process, scratch: str, cgroup: Cgroup | None, max_output: int):
        self.process = process
        self.scratch = scratch
        self.cgroup = cgroup
        self.max_output = max_output

    async def send(self, message: dict) -> None:
        data = json.dumps(message).encode("utf-8")
        assert self.process.stdin is not None
        self.process.stdin.write(struct.pack(">I", len(data)) + data)
        await self.process.stdin.drain()

    async def receive(self) -> dict:
        assert self.process.stdout is not None
        header = await self.process.stdout.readexactly(4)
        (size,) = struct.unpack(">I", header)
        if size > self.max_output:
            raise _OutputTooLarge(size)
        return json.loads(await self.process.stdout.readexactly(size))

    async def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.process.wait(), 10)
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.remove)


class SandboxPool:
    def __init__(self, spec: SandboxSpec):
        self.spec = spec
        self.isolation = spec.isolation
        if spec.isolation == "strict":
            reason = mechanism.strict_unavailable()
            if reason:
                raise SandboxUnavailable(reason)
        self._idle: asyncio.Queue[_Worker] | None = None
        self._slots: asyncio.Semaphore | None = None
        self._all: set[_Worker] = set()
        self.restarts = 0

    @property
    def weak(self) -> bool:
        return self.isolation == "weak"

    async def _start(self) -> _Worker:
        scratch = tempfile.mkdtemp(prefix="openrft-sandbox-")
        cgroup = None
        if self.isolation == "strict":
            layout, _ = mechanism.cgroup_layout()
            if layout is not None:
                cgroup = Cgroup(layout, self.spec.memory_limit_mb << 20, self.spec.max_processes)
            command = mechanism.strict_command(
                scratch, self.spec.memory_limit_mb, self.spec.python_paths, self.spec.scratch_limit_mb
            )
            # bwrap itself is PID 1 of the sandbox, and its /proc/1/environ is readable from inside: it
            # must not hold the caller's environment (API keys, the judge key, database URLs)
            env, cwd = {}, None
        else:
            command = mechanism.weak_command(scratch, self.spec.memory_limit_mb, self.spec.python_paths)
            env, cwd = dict(mechanism.WEAK_ENV, HOME=scratch, TMPDIR=scratch), scratch
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=cwd,
            limit=2**26,
            preexec_fn=cgroup.enter if cgroup is not None else None,
        )
        worker = _Worker(process, scratch, cgroup, self.spec.output_limit_mb << 20)
        try:
            ready = await asyncio.wait_for(worker.receive(), START_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError) as exc:
            await worker.kill()
            raise RewardError(
                f"a sandboxed worker did not start ({type(exc).__name__}); command: {' '.join(command[:3])} ..."
            ) from None
        if ready.get("value") != "ready":
            await worker.kill()
            raise RewardError(f"a sandboxed worker did not start: {ready}")
        self._all.add(worker)
        return worker

    async def _acquire(self) -> _Worker:
        if self._idle is None:
            self._idle = asyncio.Queue()
            self._slots = asyncio.Semaphore(self.spec.workers)
        assert self._slots is not None
        await self._slots.acquire()
        try:
            if not self._idle.empty():
                return self._idle.get_nowait()
            return await self._start()
        except BaseException:
            self._slots.release()
            raise

    def _release(self, worker: _Worker | None) -> None:
        assert self._idle is not None and self._slots is not None
        if worker is not None:
            self._idle.put_nowait(worker)
        self._slots.release()

    async def _discard(self, worker: _Worker) -> None:
        self._all.discard(worker)
        self.restarts += 1
        await worker.kill()

    async def call(
        self,
        source: str,
        entry: str,
        args: list[Any],
        time_limit_s: float,
        check_only: bool = False,
        content_args: tuple[int, ...] = (),
        script: dict[str, Any] | None = None,
    ) -> CallResult:
        """Run ``entry(*args)`` from ``source`` in a worker, within ``time_limit_s`` seconds; the arguments
        at ``content_args`` are Vertex Content dicts, passed as the worker's ``VertexContent``. With ``script``
        (``{names, extra, result}``) ``source`` is run as a script instead of calling ``entry``."""
        worker = await self._acquire()
        keep: _Worker | None = worker
        try:
            request = {"source": source, "entry": entry, "args": args, "check": check_only}
            if content_args:
                request["content_args"] = list(content_args)
            if script is not None:
                request["script"] = script
            try:
                await worker.send(request)
                answer = await asyncio.wait_for(worker.receive(), time_limit_s)
            except TimeoutError:
                keep = None
                await self._discard(worker)
                message = f"{entry}() ran past its time limit of {time_limit_s:g} s"
                return CallResult(kind="timeout", message=message, limit="time")
            except _OutputTooLarge as exc:
                keep = None
                await self._discard(worker)
                message = (
                    f"{entry}() answered {exc.args[0]:,} bytes, past the output limit of {self.spec.output_limit_mb} MB"
                )
                return CallResult(kind="invalid_output", message=message, limit="output")
            except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError):
                keep = None
                code = await _exit_code(worker)
                limit = self._limit_hit(worker, "")
                await self._discard(worker)
                reason = f": {LIMIT_WORDS[limit].format(spec=self.spec)}" if limit else ""
                message = f"{entry}() killed its sandboxed worker ({code}){reason}"
                return CallResult(kind="runtime_error", message=message, limit=limit)
            printed = str(answer.get("stdout") or "")
            if answer.get("ok"):
                if worker.cgroup is not None and (worker.cgroup.memory_hit() or worker.cgroup.pids_hit()):
                    keep = None  # its counters are spent: the next call starts in a fresh sandbox
                    await self._discard(worker)
                return CallResult(value=answer.get("value"), stdout=printed)
            message = str(answer.get("message"))
            limit = self._limit_hit(worker, message)
            if worker.process.returncode is not None or limit is not None:
                keep = None
                await self._discard(worker)
            if limit is not None:
                message = f"{message}\n({LIMIT_WORDS[limit].format(spec=self.spec)})"
            kind = answer.get("kind", "runtime_error")
            return CallResult(kind=kind, message=message, limit=limit, stdout=printed)
        except BaseException:
            if keep is not None:
                keep = None
                await self._discard(worker)
            raise
        finally:
            self._release(keep)

    @staticmethod
    def _limit_hit(worker: _Worker, message: str) -> str | None:
        """Which of the sandbox's limits a failed call ran into, from its cgroup's counters and its error."""
        if "MemoryError" in message or (worker.cgroup is not None and worker.cgroup.memory_hit()):
            return "memory"
        if worker.cgroup is not None and worker.cgroup.pids_hit():
            return "processes"
        if "No space left on device" in message or "File too large" in message:
            return "scratch"
        return None

    async def aclose(self) -> None:
        for worker in list(self._all):
            await worker.kill()
        self._all.clear()


async def _exit_code(worker: _Worker) -> str:
    try:
        code = await asyncio.wait_for(worker.process.wait(), 5)
    except TimeoutError:
        return "it stopped answering"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"
