"""Service settings: where the data lives, which database, limits and timings. Passed in, never global."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from openrft.service.tinker.settings import TinkerSettings
from openrft.spec.tools import McpServerSpec

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def default_data_dir() -> Path:
    """``$OPENRFT_HOME``, else ``~/.openrft``."""
    return Path(os.environ.get("OPENRFT_HOME") or Path.home() / ".openrft")


@dataclass
class ServiceConfig:
    data_dir: Path
    database_url: str
    host: str = "127.0.0.1"
    max_request_bytes: int = 1 << 20  # JSON bodies
    max_upload_bytes: int = 512 << 20  # files
    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 30.0
    poll_interval_s: float = 0.5
    cancel_grace_s: float = 10.0
    max_attempts: int = 3
    # operator settings tenants cannot change (docs/service.md, Security)
    allow_private_urls: bool = False  # tenants' URLs may reach loopback, link-local and private addresses
    sandbox_max_memory_mb: int = 2048  # the most a tenant's reward.sandbox.memory_limit_mb may ask for
    sandbox_max_time_s: float = 300.0  # ... reward.sandbox.time_limit_s
    sandbox_max_workers: int = 4  # ... reward.sandbox.workers
    sandbox_max_scratch_mb: int = 256  # ... reward.sandbox.scratch_limit_mb
    sandbox_max_processes: int = 64  # ... reward.sandbox.max_processes
    sandbox_max_output_mb: int = 16  # ... reward.sandbox.output_limit_mb
    grader_workers: int = 8  # graders/run and reward validation calls run at once (each in its own sandbox)
    grader_queue_limit: int = 64  # more calls wait; past that, 429
    # per tenant (API key): quotas and fair shares (docs/service.md, "Tenants share fairly")
    grader_workers_per_tenant: int = 4  # of the grader_workers, the most one tenant's calls hold at once
    grader_calls_per_tenant: int = 16  # one tenant's calls running and waiting; past that, 429
    max_queued_jobs_per_tenant: int | None = 100  # jobs waiting to start; past that, 429 (None: no cap)
    max_stored_mb_per_tenant: int | None = 4096  # bytes of files; past that, 413 (None: no cap)
    # object-store prefixes (s3://, gs://, hf://) each tenant may name, by key id or name ("*": every tenant)
    store_prefixes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    tenant_store_prefixes: tuple[str, ...] = ()  # those of the tenant a request is checked for (tenant_config)
    # the Tinker API's bounds per request and the base models it publishes (openrft serve --tinker-*, --model)
    tinker: TinkerSettings = field(default_factory=TinkerSettings)
    # the Ray cluster every job runs on (openrft serve/worker --ray-address: auto, HOST:PORT, ray://HOST:10001);
    # None: jobs run in their job process (runtime: ray ones on a Ray instance started for the job). Never a tenant's
    ray_address: str | None = None
    # without a cluster: this machine's GPUs the workers give jobs, one job each unless jobs_per_gpu says more
    gpus: list[str] = field(default_factory=list)
    jobs_per_gpu: int = 1
    # MCP servers the operator registered (--mcp-servers FILE), by name: tenants' jobs name them (mcp_registry)
    mcp_servers: dict[str, McpServerSpec] = field(default_factory=dict)
    # where agents reach this server (--agent-base-url): a rollout.agent job hands its agent
    # {agent_base_url}/v1/agent/JOB/TRAJECTORY (routes_agents.py); None: the job's own 127.0.0.1 routes
    agent_base_url: str | None = None

    @classmethod
    def build(cls, data_dir: str | Path | None = None, database_url: str | None = None, **kwargs) -> ServiceConfig:
        root = Path(data_dir).expanduser() if data_dir else default_data_dir()
        url = database_url or os.environ.get("OPENRFT_DATABASE_URL") or f"sqlite:///{root / 'openrft.db'}"
        return cls(data_dir=root.resolve(), database_url=url, **kwargs)

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    def ensure_dirs(self) -> None:
        for path in (self.data_dir, self.files_dir, self.runs_dir):
            path.mkdir(parents=True, exist_ok=True)

    def store_prefixes_for(self, key_id: str, key_name: str | None) -> tuple[str, ...]:
        """The object-store prefixes allowed to the tenant with this key (by its id, its name, or ``*``)."""
        found: list[str] = []
        for who in ("*", key_id, key_name):
            if who is not None:
                found += [p for p in self.store_prefixes.get(who, ()) if p not in found]
        return tuple(found)

    @property
    def max_stored_bytes_per_tenant(self) -> int | None:
        return None if self.max_stored_mb_per_tenant is None else self.max_stored_mb_per_tenant << 20

    @property
    def loopback_only(self) -> bool:
        return self.host in LOOPBACK_HOSTS
