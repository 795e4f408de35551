"""Every field of a job that names an address is declared as one (``openrft.spec.urls``), and the service's
tenant checks reach every declared one: a new address field cannot bypass the outbound policy."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from openrft.service.config import ServiceConfig
from openrft.service.tenancy import job_problems
from openrft.spec.job import JobSpec
from openrft.spec.urls import declared_fields, url_values

ADDRESS_NAME = re.compile(r"url|uri|endpoint|address|host|server", re.IGNORECASE)
# Fields whose names say "address" but hold none: each with the reason.
NOT_ADDRESSES = {
    ("ToolsSpec", "mcp_servers"): "a mapping of server definitions, whose own fields are checked",
    ("McpServerSpec", "registered"): "the name of an operator's server, resolved by the service",
}
INTERNAL = "http://127.0.0.1:9/x"
FIELDS = {"data.train": "run.data_s3_path", "data.validation": "run.validation_data_s3_path", "reward": "reward"}


def a_job_naming_every_address() -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "openrft-demo"},
            "data": {"train": INTERNAL + "/train.jsonl", "validation": INTERNAL + "/val.jsonl"},
            "training": {"prompts_per_step": 2, "total_steps": 1},
            "reward": {"function": {"type": "preset", "name": "exact_match"}},
            "rollout": {"generator_base_url": [INTERNAL, "http://[::1]:8000/v1"], "ray_address": "127.0.0.1:6379"},
            "tracking": {"mlflow_tracking_uri": "http://169.254.169.254/mlflow"},
            "tools": {
                "functions": {"calc": {"type": "http", "url": "http://0x7f000001/tool"}},
                "mcp_servers": {"clock": {"url": "http://127.0.0.1:8/mcp"}},
            },
            "output_dir": "http://10.0.0.1/out",
        }
    )


def test_every_field_named_like_an_address_is_declared_as_one():
    unmarked = [
        f"{cls.__name__}.{name}"
        for cls, name, marker in declared_fields(JobSpec)
        if ADDRESS_NAME.search(name) and marker is None and (cls.__name__, name) not in NOT_ADDRESSES
    ]
    assert unmarked == []


def test_the_tenant_checks_refuse_every_declared_address_outside_the_reward():
    spec = a_job_naming_every_address()
    declared = {
        (cls.__name__, name)
        for cls, name, marker in declared_fields(JobSpec)
        if marker is not None and marker.role != "reward"
    }
    set_here = {path for path, _, marker in url_values(spec) if marker.role != "reward"}
    # this job sets every declared address field (a new one must be added here, and so gets checked)
    owners = {
        ("DataSpec", "train"),
        ("DataSpec", "validation"),
        ("RolloutSpec", "generator_base_url"),
        ("RolloutSpec", "ray_address"),
        ("TrackingSpec", "mlflow_tracking_uri"),
        ("HttpToolSpec", "url"),
        ("McpServerSpec", "url"),
        ("AgentSpec", "url"),  # a job with an agent has no tools block: test_an_agents_url_is_checked_too
        ("JobSpec", "output_dir"),
        ("JudgeSpec", "base_url"),  # inside the reward: reward_problems refuses it (test_security)
    }
    assert declared == owners
    problems = job_problems(spec, ServiceConfig.build("/tmp/unused"), FIELDS, {})
    refused = {field for _, field, _, _ in problems}
    assert refused == {
        "run.data_s3_path",
        "run.validation_data_s3_path",
        "rollout.generator_base_url.0",
        "rollout.generator_base_url.1",  # each server of the list
        "rollout.ray_address",
        "tracking.mlflow_tracking_uri",
        "openrft.tools.functions.calc.url",
        "openrft.tools.mcp_servers.clock.url",
        "output_dir",
    }
    assert len(set_here) == 9  # every address this job names was walked


@pytest.mark.parametrize(
    "value",
    ["https://example.com/v1,http://127.0.0.1:8000/v1", "http://a/v1 http://b/v1", "file:///etc/passwd", "x"],
)
def test_a_generator_url_is_one_http_url(value):
    with pytest.raises(ValidationError, match=r"not one URL|not an http"):
        JobSpec.model_validate(
            {
                "model": {"name_or_path": "openrft-demo"},
                "data": {"train": "t.jsonl"},
                "training": {"prompts_per_step": 2, "total_steps": 1},
                "reward": {"function": {"type": "preset", "name": "exact_match"}},
                "rollout": {"generator_base_url": value},
            }
        )


def test_several_generator_servers_are_a_list():
    spec = a_job_naming_every_address()
    assert spec.rollout.generator_base_url == [INTERNAL, "http://[::1]:8000/v1"]
    one = spec.rollout.model_copy(update={}).model_validate({"generator_base_url": "http://h:1/v1"})
    assert one.generator_base_url == ["http://h:1/v1"]


def test_an_agents_url_is_checked_too():
    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": "openrft-demo"},
            "data": {"train": "t.jsonl"},
            "training": {"prompts_per_step": 2, "total_steps": 1},
            "reward": {"function": {"type": "preset", "name": "exact_match"}},
            "rollout": {"agent": {"url": INTERNAL}},
        }
    )
    problems = job_problems(spec, ServiceConfig.build("/tmp/unused"), FIELDS, {})
    assert {field for _, field, _, _ in problems} == {"rollout.agent.url"}
