"""Bring your own agent: the job drives the user's agent and serves the routes it samples the model through.

``AgentService`` (one per job) runs an event loop thread that serves the agent routes
(``tools.agent_routes``) on 127.0.0.1 and calls the agent (``rollout.agent``: an HTTP endpoint, or an
operator's Python callable) once per trajectory. ``AgentGenerator`` wraps any generator as ``ToolGenerator``
does: its ``generate(prompts, params)`` starts ``params.n`` trajectories per prompt, samples the turns they
ask for in batches (``tools.agent_batcher``) and returns each trajectory as one Completion, the same training
record the built-in tool loop makes (``tools.agent_trajectory``).

A trajectory ends when the agent's call returned and the trajectory is complete (CompleteRollout, or the
call's successful return, which completes it). One that fails (the call fails or times out, the agent marks it
failed, its history changed) is started again under a new id, up to ``max_retries`` times; then it is dropped
with its error kind (``agent_error``, ``timeout``, ``history_changed``): counted in the metrics, never scored.
Its reward is the agent's UpdateReward (the sum of its per-turn values) or else the job's reward.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import secrets
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx

from openrft.calls.endpoints import async_client
from openrft.calls.outbound import OutboundRefused
from openrft.data.records import Example
from openrft.rollout.types import Completion, SamplingParams, WrappedGenerator
from openrft.spec.agents import AgentSpec
from openrft.tools.agent_batcher import TurnBatcher
from openrft.tools.agent_trajectory import Renderer, Trajectory, TrajectoryError
from openrft.tools.episodes import _row, with_rows, wrapper

ADDRESS_FILE = "agent_routes.json"
"""In the run directory: where the job serves its agent routes (port, token), for the job service's proxy."""


class AgentFailure(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def load_callable(target: str) -> Callable[..., Any]:
    """``package.module:function`` or ``/path/file.py:function``."""
    module_name, _, name = target.rpartition(":")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"openrft_agent_{uuid.uuid4().hex[:8]}", module_name)
        if spec is None or spec.loader is None:
            raise AgentFailure("agent_error", f"rollout.agent.callable: cannot load {module_name!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    function = getattr(module, name, None)
    if not callable(function):
        raise AgentFailure("agent_error", f"rollout.agent.callable: {module_name!r} has no function {name!r}")
    return function


class AgentService:
    """The job's agent routes and agent calls on one event loop thread (see the module docstring)."""

    def __init__(self, spec: AgentSpec, job_id: str, renderer: Renderer, public_base: str | None = None):
        from openrft.tools.agent_routes import serve

        self.spec, self.job_id, self.renderer = spec, job_id, renderer
        self.token = secrets.token_urlsafe(24)
        self.trajectories: dict[str, Trajectory] = {}
        self.batchers: dict[str, TurnBatcher] = {}
        self.counts = {"started": 0, "completed": 0, "dropped": 0, "retried": 0}
        self._address: Path | None = None
        self._running: set[str] = set()  # trajectories whose batcher counts them as possibly sampling
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openrft-agents", daemon=True)
        self._thread.start()
        self._function = load_callable(spec.callable) if spec.callable else None
        self.client, self.semaphore, self.server, self.port = self.run(self._start(serve))
        self.public_base = (public_base or f"http://127.0.0.1:{self.port}").rstrip("/")

    async def _start(self, serve):
        # the agent's url may be a tenant's: connected to addresses the outbound policy checks (calls/transport.py)
        client = async_client(timeout=httpx.Timeout(self.spec.timeout), follow_redirects=False)
        server, port = await serve(self)
        return client, asyncio.Semaphore(self.spec.max_concurrency), server, port

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def base_url(self, trajectory_id: str) -> str:
        return f"{self.public_base}/v1/agent/{self.job_id}/{trajectory_id}"

    def write_address(self, run_dir: Path) -> Path:
        """Where the routes are, for the job service's proxy (readable by this user only: it holds the token)."""
        path = self._address = Path(run_dir) / ADDRESS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"port": self.port, "token": self.token, "job_id": self.job_id}, out)
        return path

    # the routes' side ----------------------------------------------------------------------------

    def trajectory(self, job_id: str, trajectory_id: str) -> Trajectory:
        found = self.trajectories.get(trajectory_id) if job_id == self.job_id else None
        if found is None:
            raise TrajectoryError(
                404, f"no trajectory {trajectory_id!r} is running in job {job_id!r} (finished, dropped, or unknown)"
            )
        return found

    async def sample(self, trajectory: Trajectory, body: dict[str, Any]) -> dict[str, Any]:
        """One turn: planned against the record, sampled in a batch, recorded; the answer's parts."""
        if trajectory.busy:
            raise TrajectoryError(409, f"trajectory {trajectory.id} is sampling a turn already: one Sample at a time")
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        trajectory.busy = True
        try:
            plan = trajectory.plan(body["messages"], body.get("tools"), asked, self.renderer)
            if plan is None:
                return trajectory.last_answer  # type: ignore[return-value]
            completion = None
            if plan.max_new_tokens > 0:
                batcher = self.batchers[trajectory.id]
                completion = await asyncio.wrap_future(batcher.submit(plan.context, plan.max_new_tokens, trajectory.id))
            return trajectory.record(plan, completion, self.renderer)
        finally:
            trajectory.busy = False

    def complete(self, trajectory: Trajectory, status: str) -> None:
        trajectory.complete(status)
        self._not_sampling(trajectory.id)

    def _not_sampling(self, trajectory_id: str) -> None:
        """A complete trajectory samples no more: its batcher no longer waits for it."""
        if trajectory_id in self._running:
            self._running.discard(trajectory_id)
            self.batchers[trajectory_id].ended()

    # driving the agent ---------------------------------------------------------------------------

    async def drive(self, batcher: TurnBatcher, example: Example, index: int, sample: int, params: SamplingParams):
        """One trajectory of a row, started again on failure (up to ``max_retries``); the last one's record."""
        attempts = self.spec.max_retries + 1
        trajectory = None
        for attempt in range(attempts):
            trajectory = Trajectory(
                f"traj-{uuid.uuid4().hex}", example, index, sample, attempt, params.max_new_tokens, params.max_length
            )
            self.trajectories[trajectory.id] = trajectory
            self.batchers[trajectory.id] = batcher
            self.counts["started"] += 1
            try:
                async with self.semaphore:
                    batcher.started(first=attempt == 0)
                    self._running.add(trajectory.id)
                    try:
                        await asyncio.wait_for(self._one(trajectory), self.spec.timeout)
                    except TimeoutError:
                        limit = f"rollout.agent.timeout ({self.spec.timeout:g} s)"
                        trajectory.fail(
                            "timeout", f"the agent did not finish trajectory {trajectory.id} within {limit}"
                        )
                    finally:
                        self._not_sampling(trajectory.id)
            except AgentFailure as failure:
                trajectory.fail(failure.kind, failure.message)
            finally:
                self.trajectories.pop(trajectory.id, None)
                self.batchers.pop(trajectory.id, None)
            if trajectory.failure is None:
                self.counts["completed"] += 1
                return trajectory
            if trajectory.failure[0] == "history_changed" or attempt + 1 == attempts:
                break
            self.counts["retried"] += 1
        self.counts["dropped"] += 1
        return trajectory

    async def _one(self, trajectory: Trajectory) -> None:
        request = {
            "trajectory_id": trajectory.id,
            "base_url": self.base_url(trajectory.id),
            "api_key": self.token,
            "job_id": self.job_id,
            "row": trajectory.example.row(),
            "sample_index": trajectory.sample_index,
            "attempt": trajectory.attempt,
        }
        await self._call(request)
        if not trajectory.completed:  # the agent returned: its trajectory is complete
            trajectory.complete("ready")
        if trajectory.status == "failed":
            raise AgentFailure("agent_error", f"the agent marked trajectory {trajectory.id} failed (CompleteRollout)")
        if trajectory.failure is not None:
            return
        if not trajectory.prompt_ids:
            raise AgentFailure("agent_error", f"the agent finished trajectory {trajectory.id} without sampling a turn")
        while self.spec.await_reward and trajectory.rewards is None:  # bounded by the trajectory's timeout
            await asyncio.sleep(0.01)

    async def _call(self, request: dict[str, Any]) -> None:
        if self._function is not None:
            try:
                if inspect.iscoroutinefunction(self._function):
                    await self._function(request)
                else:
                    await asyncio.to_thread(self._function, request)
            except Exception as exc:
                message = f"the agent {self.spec.callable} raised {type(exc).__name__}: {exc}"
                raise AgentFailure("agent_error", message) from None
            return
        url = self.spec.url
        try:
            response = await self.client.post(url, json=request, headers=self.spec.headers)
        except (httpx.HTTPError, OutboundRefused) as exc:
            message = f"the agent at {url} could not be reached: {type(exc).__name__}: {exc}"
            raise AgentFailure("agent_error", message) from None
        if response.status_code >= 400:
            text = response.text[:300]
            raise AgentFailure("agent_error", f"the agent at {url} answered HTTP {response.status_code}: {text}")

    def close(self) -> None:
        if self._address is not None:  # the routes end here: no proxy is sent to them, no token left behind
            self._address.unlink(missing_ok=True)
            self._address = None
        if self._loop.is_closed():
            return

        async def stop() -> None:
            self.server.should_exit = True
            await self.client.aclose()
            await asyncio.wait_for(self.server.task, 5)

        try:
            self.run(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


class AgentGenerator(WrappedGenerator):
    """A generator whose completions are the user's agent's trajectories (see the module docstring)."""

    def __init__(self, inner: Any, service: AgentService):
        self.inner, self.service = inner, service

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        service = self.service
        batcher = TurnBatcher(self.inner, params, service.spec.batch_window_s)
        batcher.expect(len(prompts) * params.n, service.spec.max_concurrency)
        futures: list[list[Future]] = []
        for prompt in prompts:
            example, index = _row(prompt)
            group = []
            for j in range(params.n):
                future = asyncio.run_coroutine_threadsafe(
                    service.drive(batcher, example, index, j, params), service.loop
                )
                future.add_done_callback(lambda _: batcher.wake())
                group.append(future)
            futures.append(group)
        flat = [f for group in futures for f in group]
        try:
            batcher.run_until(lambda: all(f.done() for f in flat))
        except BaseException:
            for future in flat:
                future.cancel()
            raise
        version = self.inner.policy_version
        return [[f.result().completion(version) for f in group] for group in futures]


def agent_generators(spec, parts, run_dir: Path | None = None, public_base: str | None = None):
    """The job's AgentService and a function that wraps a generator or a replica so that its completions are
    the agent's trajectories (as ``tools.episodes.tool_generators`` does for the built-in loop)."""
    with_rows(parts)
    renderer = Renderer(parts.tokenizer, frozenset(parts.eos_ids), spec.sampling.reasoning_effort)
    job_id = Path(run_dir).name if run_dir is not None else spec.name
    service = AgentService(spec.rollout.agent, job_id, renderer, public_base)
    if run_dir is not None:
        service.write_address(Path(run_dir))
    return service, wrapper(lambda generator: AgentGenerator(generator, service))
