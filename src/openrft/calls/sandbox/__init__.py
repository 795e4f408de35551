"""Sandboxed execution of user code: a pool of isolated worker processes (see ``mechanism``)."""

from openrft.calls.sandbox.pool import CallResult, SandboxPool, SandboxUnavailable

__all__ = ["CallResult", "SandboxPool", "SandboxUnavailable"]
