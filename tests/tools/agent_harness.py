"""A user's agent behind a real HTTP entrypoint on 127.0.0.1, driven by an AgentGenerator over a generator.

The agent functions use the official ``openai`` client against the routes the AgentService serves."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from openrft.data.records import Example
from openrft.rollout.types import SamplingParams
from openrft.spec.agents import AgentSpec
from openrft.tools.agent_runtime import AgentGenerator, AgentService
from openrft.tools.agent_trajectory import Renderer
from openrft.tools.episodes import row_prompts
from tests.tools.scripted import prompts_of


class Entrypoint(ThreadingHTTPServer):
    """POST / runs ``agent(request)`` in its own thread; 200 with what it returned, 500 when it raised."""

    daemon_threads = True
    request_queue_size = 256

    def __init__(self, agent: Callable[[dict], Any]):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(request)
                try:
                    body, status = json.dumps({"answer": agent(request)}).encode(), 200
                except Exception as exc:
                    body, status = json.dumps({"error": repr(exc)}).encode(), 500
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class RecordingGenerator:
    """Any generator, with every turn it sampled kept: (context ids, completion)."""

    def __init__(self, inner):
        self.inner = inner
        self.sampled: list[tuple[list[int], Any]] = []

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def generate(self, prompts, params, seed=None):
        groups = self.inner.generate(prompts, params, seed)
        for prompt, group in zip(prompts, groups):
            self.sampled += [(list(prompt), c) for c in group]
        return groups


class AgentRun:
    """An AgentService with its entrypoint; ``run(examples, n)`` returns the trajectories as completions."""

    def __init__(self, tokenizer, generator, agent: Callable[[dict], Any], eos: list[int], **spec: Any):
        self.tokenizer = tokenizer
        self.entrypoint = Entrypoint(agent)
        self.spec = AgentSpec.model_validate({"url": self.entrypoint.url, **spec})
        self.service = AgentService(self.spec, "job-a", Renderer(tokenizer, frozenset(eos)))
        self.generator = RecordingGenerator(generator)
        self.agent = AgentGenerator(self.generator, self.service)

    def run(self, examples: list[Example], n: int = 1, budget: int = 300, max_length: int | None = None):
        prompts = row_prompts(examples, prompts_of(self.tokenizer, examples))
        return self.agent.generate(prompts, SamplingParams(n=n, max_new_tokens=budget, max_length=max_length))

    def close(self) -> None:
        self.service.close()
        self.entrypoint.shutdown()
        self.entrypoint.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
