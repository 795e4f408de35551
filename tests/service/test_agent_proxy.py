"""A running job's agent routes through the job service (``/v1/agent/{job_id}/...``): the official ``openai``
client with the owning tenant's key samples the job's trajectory (streaming too), another tenant's key gets a
404, as for a job that does not exist (a real SQLite store, the real app on 127.0.0.1, the job's real routes)."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from openrft.rollout.types import SamplingParams
from openrft.service.app import create_app
from openrft.service.config import ServiceConfig
from openrft.service.store import Store
from openrft.service.store.models import Job
from openrft.spec.agents import AgentSpec
from openrft.tools.agent_runtime import AgentGenerator, AgentService
from openrft.tools.agent_trajectory import Renderer
from openrft.tools.episodes import row_prompts
from tests.service.svc_helpers import app_in_thread
from tests.tools.agent_harness import Entrypoint
from tests.tools.scripted import ScriptedGenerator, prompts_of, question, tool_tokenizer


def _job(owner: str, name: str) -> Job:
    return Job(
        id=f"ftjob-{name}",
        owner=owner,
        api="nova",
        status="running",
        request={},
        spec={"name": name},
        model="openrft-demo",
        display_name=name,
        total_steps=2,
    )


@pytest.fixture
def served(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'openrft.db'}")
    (key_a, secret_a), (_, secret_b) = store.create_key("a"), store.create_key("b")
    job = store.create_job(_job(key_a.id, "agent"))
    config = ServiceConfig.build(tmp_path / "data", str(store.engine.url))
    with app_in_thread(create_app(config, store)) as port:
        yield port, config, job, {"a": secret_a, "b": secret_b}
    store.close()


def test_the_owning_tenant_reaches_its_jobs_trajectory_and_another_tenant_gets_404(served):
    port, config, job, keys = served
    base = f"http://127.0.0.1:{port}"
    seen: dict = {}

    def agent(request: dict) -> str:
        url = request["base_url"]
        assert url.startswith(f"{base}/v1/agent/{job.id}/")  # the service's address, the job's path
        owner = OpenAI(base_url=url, api_key=keys["a"], max_retries=0)
        answer = owner.chat.completions.create(model="m", messages=request["row"]["messages"])
        other = OpenAI(base_url=url, api_key=keys["b"], max_retries=0)
        try:
            other.chat.completions.create(model="m", messages=request["row"]["messages"])
        except openai.NotFoundError as exc:
            seen["other"] = exc.status_code
        messages = [*request["row"]["messages"], answer.choices[0].message.model_dump(exclude_none=True)]
        messages.append({"role": "user", "content": "again"})
        stream = owner.chat.completions.create(model="m", messages=messages, stream=True)
        seen["streamed"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        token = {"Authorization": f"Bearer {request['api_key']}"}  # the job's own token works too
        seen["token"] = httpx.post(f"{url}/complete-rollout", json={}, headers=token).status_code
        seen["anonymous"] = httpx.post(f"{url}/complete-rollout", json={}).status_code
        seen["no job"] = httpx.post(
            url.replace(job.id, "ftjob-none") + "/complete-rollout", json={}, headers=token
        ).status_code
        return answer.choices[0].message.content

    tokenizer = tool_tokenizer()
    entrypoint = Entrypoint(agent)
    spec = AgentSpec(url=entrypoint.url, max_retries=0)
    service = AgentService(spec, job.id, Renderer(tokenizer, frozenset([tokenizer.eos_token_id])), base)
    service.write_address(config.runs_dir / job.id)
    try:
        examples = [question(6, 7)]
        generator = AgentGenerator(ScriptedGenerator(tokenizer, lambda context: "42"), service)
        (group,) = generator.generate(row_prompts(examples, prompts_of(tokenizer, examples)), SamplingParams())
    finally:
        service.close()
        entrypoint.shutdown()
        entrypoint.server_close()
    assert seen == {"other": 404, "streamed": "42", "token": 200, "anonymous": 401, "no job": 404}
    (completion,) = group
    assert "tool_failure" not in completion.metadata and completion.metadata["tools"]["turns"] == 2
