"""``rollout.agent`` (docs/agents.md): one entrypoint, named problems, a tenant's agent is an http endpoint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from openrft.service.config import ServiceConfig
from openrft.service.tenancy import job_problems
from openrft.spec.agents import AgentSpec
from openrft.spec.job import JobSpec

FIELDS = {"data.train": "data.train", "data.validation": "data.validation", "reward": "reward"}


def job(agent: dict, **extra) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "openrft-demo"},
            "data": {"train": "t.jsonl"},
            "training": {"prompts_per_step": 2, "total_steps": 1},
            "reward": {"function": {"type": "preset", "name": "exact_match"}},
            "rollout": {"agent": agent},
            **extra,
        }
    )


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({}, "exactly one of url"),
        ({"url": "http://127.0.0.1:9/a", "callable": "a.py:run"}, "exactly one of url"),
        ({"callable": "agent.run"}, "'agent.run' is not module:function"),
        ({"url": "ftp://x/a"}, "not an http"),
        ({"url": "http://127.0.0.1:9/a", "timeout": 0}, "greater than 0"),
        ({"callable": "a.py:run", "headers": {"X": "1"}}, "headers are sent to rollout.agent.url"),
    ],
)
def test_a_bad_agent_block_is_refused_naming_what_is_wrong(agent, message):
    with pytest.raises(ValidationError, match=re.escape(message)) as raised:
        job(agent)
    assert "rollout.agent" in str(raised.value)


def test_an_agent_and_tools_are_exclusive():
    with pytest.raises(ValidationError, match=r"rollout\.agent and tools are both set"):
        job({"url": "http://127.0.0.1:9/a"}, tools={"max_turns": 2})


def test_a_tenants_agent_is_an_http_endpoint_never_python_in_the_job():
    config = ServiceConfig.build("/tmp/unused", allow_private_urls=True)
    problems = job_problems(job({"callable": "my_agent.py:run"}), config, FIELDS, {})
    assert [(field, value) for _, field, _, value in problems] == [("rollout.agent.callable", "my_agent.py:run")]
    assert job_problems(job({"url": "http://127.0.0.1:9/a"}), config, FIELDS, {}) == []


def test_a_callable_file_is_read_relative_to_the_job_file(tmp_path):
    spec = AgentSpec(callable="agents/mine.py:run").relative_to(tmp_path)
    assert spec.callable == f"{(tmp_path / 'agents' / 'mine.py').resolve()}:run"
    assert AgentSpec(callable="pkg.agent:run").relative_to(Path("/x")).callable == "pkg.agent:run"
