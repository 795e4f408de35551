"""Helpers of the job service tests: server and worker processes we start, tiny jobs, polling."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "arithmetic" / "train.jsonl"
VALIDATION = ROOT / "examples" / "arithmetic" / "validation.jsonl"
POSTGRES_ENV = "OPENRFT_TEST_POSTGRES_URL"
CLI = "import sys; from openrft.cli import main; sys.exit(main())"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def app_in_thread(app) -> Iterator[int]:
    """``app`` served by uvicorn on 127.0.0.1 in a thread of this process (yields its port), stopped after."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set (CI sets it; see .ci/postgres.sh)")
    return url


@dataclass
class Process:
    """A service process (server or worker) we started; stopped by its pid at teardown."""

    proc: subprocess.Popen
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Service:
    """Starts ``openrft serve`` / ``openrft worker`` processes sharing one data directory and database."""

    data_dir: Path
    database_url: str
    processes: list[Process] = field(default_factory=list)
    base_url: str = ""
    env: dict[str, str] = field(default_factory=dict)  # added to the environment of the processes started

    def _spawn(self, args: list[str], name: str) -> Process:
        log = self.data_dir / f"{name}-{len(self.processes)}.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **self.env}
        proc = subprocess.Popen(
            [sys.executable, "-c", CLI, *args, "--data-dir", str(self.data_dir), "--database-url", self.database_url],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        process = Process(proc, log)
        self.processes.append(process)
        return process

    def serve(
        self,
        workers: int = 1,
        heartbeat_timeout: float = 30.0,
        host: str = "127.0.0.1",
        extra: tuple[str, ...] = (),
        wait: bool = True,
    ) -> Process:
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        process = self._spawn(
            [
                "serve",
                "--host",
                host,
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--heartbeat-timeout",
                str(heartbeat_timeout),
                "--log-level",
                "warning",
                *extra,
            ],
            "serve",
        )
        if wait:
            self.wait_healthy(process)
        return process

    def worker(self, heartbeat_timeout: float = 30.0, concurrency: int = 1) -> Process:
        return self._spawn(
            [
                "worker",
                "--heartbeat-timeout",
                str(heartbeat_timeout),
                "--concurrency",
                str(concurrency),
                "--poll-interval",
                "0.2",
            ],
            "worker",
        )

    def wait_healthy(self, process: Process, timeout: float = 180.0) -> None:
        """Up to 3 minutes: on a loaded 2-core machine the server's imports alone have taken over 60 s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.proc.poll() is not None:
                raise AssertionError(f"server exited with {process.proc.returncode}:\n{process.log.read_text()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not healthy after {timeout}s:\n{process.log.read_text()}")

    def cli(self, *args: str, api_key: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**os.environ, "OPENRFT_BASE_URL": self.base_url}
        if api_key:
            env["OPENRFT_API_KEY"] = api_key
        return subprocess.run(
            [sys.executable, "-c", CLI, *args], capture_output=True, text=True, env=env, timeout=timeout
        )

    def create_key(self, name: str = "test") -> str:
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                CLI,
                "keys",
                "create",
                "--name",
                name,
                "--data-dir",
                str(self.data_dir),
                "--database-url",
                self.database_url,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return result.stdout.strip()

    def stop_all(self) -> None:
        """SIGTERM to every process at once, then wait for each (SIGKILL after 30 s)."""
        for process in self.processes:
            if process.proc.poll() is None:
                process.proc.send_signal(signal.SIGTERM)
        for process in self.processes:
            process.stop()


def tiny_recipe(
    train: str, validation: str, steps: int = 2, name: str = "tiny", save_steps: int = 1, max_new_tokens: int = 6
) -> dict:
    """A Nova recipe that trains the demo model for a few seconds: 4 prompts x 4 samples per step."""
    return {
        "run": {
            "name": name,
            "model_name_or_path": "openrft-demo",
            "data_s3_path": train,
            "validation_data_s3_path": validation,
        },
        "training_config": {
            "max_length": 96,
            "global_batch_size": 16,
            "rollout": {
                "advantage_strategy": {"number_generation": 4},
                "generator": {"max_new_tokens": max_new_tokens, "temperature": 1.0},
                "rewards": {"preset_reward_function": "exact_match"},
            },
            "trainer": {
                "max_steps": steps,
                "save_steps": save_steps,
                "save_top_k": 3,
                "test_steps": 1,
                "refit_freq": 1,  # validation every reference update: every step
                "optim_config": {"lr": 1e-3},
                "peft": {"peft_scheme": "lora"},
            },
        },
        "openrft": {"eval_max_examples": 4, "max_train_examples": 16, "tensorboard": False, "threads": 1},
    }


def small_dataset(path: Path, source: Path, lines: int) -> Path:
    path.write_text("".join(source.read_text().splitlines(keepends=True)[:lines]))
    return path


def upload(client: httpx.Client, path: Path) -> str:
    response = client.post("/v1/files", files={"file": (path.name, path.read_bytes())}, data={"purpose": "fine-tune"})
    assert response.status_code == 200, response.text
    return response.json()["id"]


def wait_status(client: httpx.Client, job_id: str, statuses: tuple[str, ...], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    job = {}
    while time.monotonic() < deadline:
        job = client.get(f"/v1/fine_tuning/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still {job.get('status')} after {timeout}s: {json.dumps(job)[:2000]}")


def all_events(client: httpx.Client, job_id: str) -> list[dict]:
    """Every event, oldest first, paging with ``after``."""
    events, after = [], None
    while True:
        params = {"limit": 100, **({"after": after} if after else {})}
        page = client.get(f"/v1/fine_tuning/jobs/{job_id}/events", params=params).json()
        events.extend(page["data"])
        if not page["has_more"]:
            return events[::-1]
        after = page["data"][-1]["id"]
