"""Objects in processes of this machine, called the way Ray actors are (``handle.method.remote(*args)`` gives a
future, ``LOCAL.get(futures)`` its result), so that ``learner_group``'s classes run on this machine's cores
without Ray: ``ProcessActor`` hosts an object in a process of its own, ``ThreadActor`` one in this process.

A handle's calls run one at a time in the order they were made, as a Ray actor's do. Arguments and results go
through a pipe, pickled (tensors by value). A process that dies fails its calls with ``ProcessLost``, which names
it and its exit code, and the calls of the others in the same collective are told apart from it (``ray_faults``).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from multiprocessing.connection import Connection
from typing import Any

from openrft.errors import OpenRFTError

STOP_WAIT_S = 10.0  # how long a closed process gets to end on its own before it is killed


class ProcessLost(OpenRFTError):
    """A learner process of this machine ended while a call was in it (killed, out of memory, crashed)."""


class _Method:
    def __init__(self, submit: Callable[..., Future], name: str):
        self._submit, self._name = submit, name

    def remote(self, *args: Any) -> Future:
        return self._submit(self._name, args)


class ThreadActor:
    """``target``'s methods called on one thread of this process, in order."""

    def __init__(self, target: Any, name: str = "rank-0"):
        self.target, self.name = target, name
        self._calls = ThreadPoolExecutor(1, thread_name_prefix=f"openrft-{name}")

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self._submit, method)

    def _submit(self, method: str, args: tuple) -> Future:
        import torch

        threads = torch.get_num_threads()  # the caller's count (its phase's): a thread keeps its own otherwise

        def call() -> Any:
            torch.set_num_threads(threads)
            return getattr(self.target, method)(*args)

        return self._calls.submit(call)

    def close(self) -> None:
        self._calls.shutdown(wait=True)


class ProcessActor:
    """An instance of ``cls`` (importable by name) built from ``args`` in a Python process of its own.

    The process is ``python -m openrft.runtime.local_processes FD`` with one end of a socket pair, not
    ``multiprocessing``'s spawn: that imports the caller's ``__main__`` again in the child, which runs a user's
    unguarded script a second time."""

    def __init__(self, cls: type, args: tuple, name: str):
        ours, theirs = socket.socketpair()
        self.name = name
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
            )
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._calls = ThreadPoolExecutor(1, thread_name_prefix=f"openrft-{name}")
        self._calls.submit(self._conn.send_bytes, pickle.dumps((cls, args), protocol=pickle.HIGHEST_PROTOCOL))

    @property
    def pid(self) -> int:
        return self.process.pid

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self._submit, method)

    def _submit(self, method: str, args: tuple) -> Future:
        return self._calls.submit(self._call, method, args)

    def _call(self, method: str, args: tuple) -> Any:
        try:
            self._conn.send_bytes(pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL))
            status, value = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(1.0)
            raise ProcessLost(
                f"learner process {self.name} (pid {self.process.pid}) ended during {method}() with exit code "
                f"{self.process.returncode}: killed, out of memory or crashed (its output is above)"
            ) from None
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        """Ask the process to end (after its calls in flight), then make sure it has."""
        with contextlib.suppress(Exception):
            self._calls.submit(self._conn.send_bytes, pickle.dumps(None)).result(STOP_WAIT_S)
        self._calls.shutdown(wait=False, cancel_futures=True)
        try:
            self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_WAIT_S)
        self._conn.close()


def _serve(conn: Connection) -> None:
    """The hosted process: build the object, then answer calls until told to stop or the parent is gone."""
    try:
        cls, args = pickle.loads(conn.recv_bytes())
        target, failure = cls(*args), None
    except (EOFError, OSError):
        return
    except BaseException as exc:  # answered to every call: the caller sees why the object could not be built
        target, failure = None, _picklable(exc)
    while True:
        try:
            request = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the parent is gone
            return
        if request is None:
            return
        method, call_args = request
        try:
            if failure is not None:
                raise failure
            answer = ("ok", getattr(target, method)(*call_args))
        except BaseException as exc:
            answer = ("error", _picklable(exc))
        conn.send_bytes(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else an ``OpenRFTError`` with its type, text and traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return OpenRFTError(f"{type(exc).__name__}: {exc}\n{text}")


class _LocalSystem:
    """What ``learner_group`` asks of Ray (``get``, ``wait``, ``put``), for futures of this machine's actors."""

    @staticmethod
    def get(refs: Future | list[Future], timeout: float | None = None) -> Any:
        if isinstance(refs, Future):
            return refs.result(timeout)
        done, _ = wait(refs, timeout, return_when=FIRST_EXCEPTION)  # the first failure, not the last call's end
        for ref in refs:
            if ref in done and ref.exception() is not None:
                raise ref.exception()
        return [ref.result(timeout) for ref in refs]

    @staticmethod
    def wait(refs: list[Future], num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        done, pending = wait(refs, timeout)
        return [r for r in refs if r in done], [r for r in refs if r in pending]

    @staticmethod
    def put(value: Any) -> Any:
        return value


LOCAL = _LocalSystem()


if __name__ == "__main__":  # a ProcessActor's process: argv[1] is its end of the socket pair
    _serve(Connection(int(sys.argv[1])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing of its own to save: skip the interpreter's teardown (torch's took over a second)
