"""How a call to the outside fails, the same for rewards and tools: a failure of a named kind.

- ``parse_error``: text that had to be parsed could not be: the completion as JSON where a grader
  asks for ``sample.output_json``, or an LLM judge's reply that holds no score or label.
- ``timeout``: the call did not answer within its limit (remote calls after their retries,
  sandboxed user code).
- ``runtime_error``: user code raised, ran out of memory, or died; a formula divided by zero.
- ``server_error``: a remote endpoint failed (connection, HTTP status) after its retries.
- ``invalid_output``: the answer is not what was asked for (not a number, NaN, missing entries), or the
  example lacks a field the call needs.
- ``template_error``: the model's chat template raised (or could not continue) while an episode's tool
  results were rendered; that episode ends there (docs/tools.md, Failures).
- ``agent_error``: the user's own agent (``rollout.agent``) failed a trajectory: its endpoint or function
  failed after its retries, or it marked the trajectory failed (docs/agents.md).
- ``history_changed``: the agent sent back a conversation that does not extend the turns recorded for its
  trajectory (edited or dropped messages), so the trajectory cannot be trained on as sampled.
"""

from __future__ import annotations

from typing import Literal, get_args

ErrorKind = Literal[
    "parse_error",
    "timeout",
    "runtime_error",
    "server_error",
    "invalid_output",
    "template_error",
    "agent_error",
    "history_changed",
]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)


class CallFailure(Exception):
    """Raised for one call (one sample's reward, one tool call); the caller records it as a failure of its kind."""

    def __init__(
        self, kind: ErrorKind, message: str, stdout: str = "", status: int | None = None, limit: str | None = None
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.stdout = stdout
        self.status = status  # the HTTP status of a remote endpoint's refusal, when there was one
        self.limit = limit  # the input cap this failure hit, named
