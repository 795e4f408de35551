"""How calls to the outside behave: remote HTTP endpoints (timeouts, retries, circuit breaker), the LLM judge's
endpoint, the sandbox that runs user code. OpenRFT's own configuration, with documented defaults, shared by
rewards (``RewardSpec.remote``, ``.judge``, ``.sandbox``) and tools (``spec/tools.py``) and read by the calls
layer (``openrft.calls``); no dialect has to know about them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from openrft.spec.urls import OperatorUrl


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


MAX_CALL_TIMEOUT_S = 900.0  # AWS Lambda's own longest run
MAX_CALL_CONCURRENCY = 256  # calls in flight from one job to one endpoint


class RemoteCallSpec(_Strict):
    """Timeouts, retries and the circuit breaker of every HTTP reward call (Nova Lambda, Cloud Run,
    LLM judges).

    A call that fails transiently (connection error, timeout, HTTP 429 or 5xx) is retried up to
    ``max_retries`` times with exponential backoff from ``backoff_initial_s`` (doubling, capped at
    ``backoff_max_s``, with jitter). ``circuit_failures`` calls in a row that still fail after their
    retries mean the endpoint is down: the job fails with a RewardError naming it.
    """

    timeout_s: float | None = Field(
        None,
        gt=0,
        le=MAX_CALL_TIMEOUT_S,
        description="per attempt, the whole answer included; None = the service's limit: Nova 900 s, Cloud Run "
        "300 s, judges 60 s",
    )
    max_retries: int = Field(3, ge=0, le=20)
    backoff_initial_s: float = Field(0.5, ge=0, le=60)
    backoff_max_s: float = Field(10.0, ge=0, le=300)
    circuit_failures: int = Field(5, ge=1, le=1000, description="consecutive failed calls that fail the job")
    max_concurrency: int = Field(
        16, ge=1, le=MAX_CALL_CONCURRENCY, description="calls in flight to per-sample endpoints (Cloud Run)"
    )
    api_key_env: str | None = Field(None, description="environment variable whose value is sent as a Bearer token")


class JudgeSpec(_Strict):
    """Where LLM judges (autoraterScorer, score_model, label_model) send chat completions: any
    OpenAI-compatible server. Unset fields fall back to the environment."""

    base_url: OperatorUrl | None = Field(
        None, description="e.g. http://127.0.0.1:8000/v1; None = $OPENRFT_JUDGE_BASE_URL, else $OPENAI_BASE_URL"
    )
    api_key_env: str = Field(
        "OPENRFT_JUDGE_API_KEY", description="variable holding the key; $OPENAI_API_KEY is tried when it is unset"
    )
    model: str | None = Field(None, description="sent instead of the model the grader names (e.g. a local model)")
    max_concurrency: int = Field(8, ge=1, le=MAX_CALL_CONCURRENCY, description="judge requests in flight")
    max_tokens: int = Field(256, ge=1, le=32768, description="reply length when the grader sets none")
    structured_output: bool = Field(
        True,
        description="ask score_model/label_model judges for OpenAI's structured output (response_format "
        "json_schema {steps, result}); an endpoint that refuses it (HTTP 400/422) is asked again without it",
    )


class SandboxSpec(_Strict):
    """Where user code runs (Vertex code execution, OpenAI python graders, sandboxed callables).

    ``strict`` (default) runs it under bubblewrap: new user, network, PID and mount namespaces, no
    network, a read-only view of the Python installation only, a private writable scratch directory,
    all capabilities dropped, plus the memory limit. Without bubblewrap it refuses to run user code.
    ``weak`` runs it as a plain subprocess with the memory limit, a scratch working directory and no
    environment; it does not stop network or file access and every outcome is flagged
    (metric ``sandbox_weak``). Use it only for code you trust.
    """

    isolation: Literal["strict", "weak"] = "strict"
    workers: int = Field(2, ge=1, le=64, description="sandboxed worker processes")
    time_limit_s: float | None = Field(
        None, gt=0, le=86_400, description="per call; None = the service's: Vertex 100 s, OpenAI python grader 120 s"
    )
    memory_limit_mb: int = Field(
        2048,
        ge=64,
        le=1 << 20,
        description="memory of each worker's whole sandbox, its tmpfs files included, where the host offers "
        "cgroups; always also the address-space limit of each process (OpenAI's 2 GB)",
    )
    scratch_limit_mb: int = Field(64, ge=1, le=1 << 20, description="bytes the scratch directory (RAM) holds")
    max_processes: int = Field(32, ge=1, le=4096, description="processes in each sandbox (where cgroups are usable)")
    output_limit_mb: int = Field(16, ge=1, le=1024, description="size of one call's answer")
    python_paths: list[str] = Field(
        default_factory=list, description="extra directories importable (read-only) by user code"
    )
