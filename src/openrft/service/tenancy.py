"""What a tenant may ask of the service (docs/service.md, Security).

Two rules, applied by every route that takes a job or a grader:

- **Operator settings stay the operator's.** How user code is isolated (``reward.sandbox.isolation``,
  ``python_paths``), in-process ``callable`` rewards, which environment variable's secret is sent
  (``api_key_env``), where judges are called (``judge.base_url``) and the Ray cluster are settings of
  the operator: a tenant that sends them gets 403. Sandbox limits a tenant may lower, not raise past
  the service's caps (400 naming the cap). URLs a tenant names follow ``openrft.calls.outbound``'s policy;
  an object-store location (``s3://``, ``gs://``, ``hf://``) is reached with the operator's credentials, so
  it is refused (403) unless it lies under a prefix the operator allowed the tenant (``--allow-store-prefix``).
- **Every resource a request names belongs to the caller.** File ids, jobs, fine-tuned models
  (``ft:...:ftjob-ID``) and checkpoints (``ftckpt-...``) are looked up with the caller's tenant; another
  tenant's is reported exactly as one that does not exist.

The single user of a loopback server without API keys is the operator (``is_operator``): these
rules do not apply to them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from openrft.calls.outbound import is_store_url, refusal, store_refusal
from openrft.rewards.types import needs_of
from openrft.service.auth import LOCAL_OWNER
from openrft.service.config import ServiceConfig
from openrft.service.errors import ApiError
from openrft.service.store import NotFound, Store
from openrft.spec.job import JobSpec
from openrft.spec.rewards import RewardSpec
from openrft.spec.tools import PythonToolSpec, ToolsSpec
from openrft.spec.urls import url_values

FORBIDDEN = 403
INVALID = 400
JOB_ID = re.compile(r"\bftjob-[A-Za-z0-9]+")
CHECKPOINT_ID = re.compile(r"\bftckpt-([A-Za-z0-9]+)-\d+")

Problem = tuple[int, str, str, Any]  # status, field, message, value


def is_operator(owner: str) -> bool:
    """The single local user of a loopback server with no API keys configures the service itself."""
    return owner == LOCAL_OWNER


def raise_problems(problems: list[Problem], code: str = "invalid_job") -> None:
    """One ApiError for all problems: 403 when any is an operator setting, else 400."""
    if not problems:
        return
    status = FORBIDDEN if any(p[0] == FORBIDDEN for p in problems) else INVALID
    listed = [{"param": field, "message": f"{field}: {value!r} {message}"} for _, field, message, value in problems]
    message = "; ".join(p["message"] for p in listed)
    raise ApiError(status, message, "operator_setting" if status == FORBIDDEN else code, listed[0]["param"], listed)


def _operator_only(field: str, value: Any, what: str) -> Problem:
    return (FORBIDDEN, field, f"{what} is a setting of the service's operator; tenants cannot set it", value)


def url_problem(url: str | None, field: str, config: ServiceConfig) -> Problem | None:
    if not url:
        return None
    if is_store_url(url):
        reason = store_refusal(url, config.tenant_store_prefixes)
        return None if reason is None else (FORBIDDEN, field, reason, url)
    reason = refusal(url, config.allow_private_urls)
    return None if reason is None else (INVALID, field, reason, url)


def reward_problems(spec: RewardSpec, config: ServiceConfig, field: str, options_field: str | None) -> list[Problem]:
    """Operator settings and URLs in a tenant's reward. ``field`` is where the reward function sits in
    the request; ``options_field`` where its ``sandbox``/``remote``/``judge`` options sit (None: the
    request has no place for them)."""
    problems: list[Problem] = []
    needs = needs_of(spec.function)  # what the reward's kind reaches outside itself
    for where, value, what in needs.privileges:
        problems.append(_operator_only(f"{field}.{where}", value, what))
    for where, path in needs.files:
        problems.append(
            (INVALID, f"{field}.{where}", "is a handler file on the server; give an http(s) endpoint", path)
        )
    for where, url in needs.endpoints:
        problem = url_problem(url, f"{field}.{where}", config)
        if problem:
            problems.append(problem)
    options = options_field or "reward"
    sandbox = spec.sandbox
    if sandbox.isolation != "strict":
        problems.append(_operator_only(f"{options}.sandbox.isolation", sandbox.isolation, "the sandbox's isolation"))
    if sandbox.python_paths:
        problems.append(_operator_only(f"{options}.sandbox.python_paths", sandbox.python_paths, "python_paths"))
    caps = (
        ("memory_limit_mb", sandbox.memory_limit_mb, config.sandbox_max_memory_mb),
        ("time_limit_s", sandbox.time_limit_s, config.sandbox_max_time_s),
        ("workers", sandbox.workers, config.sandbox_max_workers),
        ("scratch_limit_mb", sandbox.scratch_limit_mb, config.sandbox_max_scratch_mb),
        ("max_processes", sandbox.max_processes, config.sandbox_max_processes),
        ("output_limit_mb", sandbox.output_limit_mb, config.sandbox_max_output_mb),
    )
    for name, value, cap in caps:
        if value is not None and value > cap:
            problems.append((INVALID, f"{options}.sandbox.{name}", f"is above the service's limit of {cap:g}", value))
    if spec.remote.api_key_env:
        problems.append(_operator_only(f"{options}.remote.api_key_env", spec.remote.api_key_env, "api_key_env"))
    judge = spec.judge
    for name in ("base_url", "api_key_env"):
        if name in judge.model_fields_set:
            problems.append(_operator_only(f"{options}.judge.{name}", getattr(judge, name), f"judge.{name}"))
    return problems


def job_problems(spec: JobSpec, config: ServiceConfig, fields: dict[str, str], shown: dict[str, str]) -> list[Problem]:
    """Operator settings and URLs in a tenant's job. ``fields`` maps spec paths to the user's field
    names (``data.train`` -> ``run.data_s3_path``); ``shown`` the stored files the request named by id.

    Every address field is found by its declaration (``openrft.spec.urls``), so a new one cannot skip the
    check; the reward's own endpoints are checked by its kind's needs (``reward_problems``)."""
    problems: list[Problem] = []
    for path, value, marker in url_values(spec):
        if path.startswith("reward."):
            continue
        field = _user_field(path, fields)
        if marker.role == "operator":
            problems.append(_operator_only(field, value, "this address"))
        elif marker.role == "outbound" or (marker.role == "location" and value not in shown and "://" in value):
            problem = url_problem(value, field, config)
            if problem:
                problems.append(problem)
    problems += reward_problems(spec.reward, config, fields["reward"], None)
    if spec.tools is not None:
        problems += tool_problems(spec.tools)
    agent = spec.rollout.agent
    if agent is not None and agent.callable is not None:
        what = "an agent run as Python code in the job's process (a tenant's agent is an http endpoint: url)"
        problems.append(_operator_only(_user_field("rollout.agent.callable", fields), agent.callable, what))
    return problems


def _user_field(path: str, fields: dict[str, str]) -> str:
    """Where the user wrote the spec field at ``path`` (a list entry keeps its index)."""
    base, dot, index = path.rpartition(".")
    if dot and index.isdigit() and base in fields:
        return f"{fields[base]}.{index}"
    if path in fields:
        return fields[path]
    return f"openrft.{path}" if path.startswith("tools.") else path


def tool_problems(tools: ToolsSpec) -> list[Problem]:
    """Tools run code of the server (Python tools, environments, stdio MCP servers): a tenant names URLs (checked
    with every other URL, ``job_problems``) and the MCP servers the operator registered."""
    problems: list[Problem] = []
    for name, runner in tools.functions.items():
        where = f"openrft.tools.functions.{name}"
        if isinstance(runner, PythonToolSpec):
            if not runner.sandboxed:
                problems.append(_operator_only(f"{where}.sandboxed", False, "an in-process Python tool"))
            else:
                message = "names Python code on the server; tenants' tools are http endpoints"
                problems.append((INVALID, f"{where}.function", message, runner.function))
        elif runner.remote.api_key_env:
            problems.append(_operator_only(f"{where}.remote.api_key_env", runner.remote.api_key_env, "api_key_env"))
    for name, server in tools.mcp_servers.items():
        where = f"openrft.tools.mcp_servers.{name}"
        if server.command is not None:
            what = "an MCP stdio server (a command run on the service's machine; name a registered server instead)"
            problems.append(_operator_only(f"{where}.command", server.command, what))
    if tools.environment is not None:
        what = "an environment class run by the service"
        problems.append(_operator_only("openrft.tools.environment.module", tools.environment.module, what))
    return problems


def check_model_reference(store: Store, owner: str, model: str | None, field: str) -> None:
    """A model that names a job (``ft:base:org:suffix:ftjob-ID``) or a checkpoint (``ftckpt-ID-STEP``) must
    be the caller's; another tenant's reads exactly like one that does not exist."""
    if not model:
        return
    job_ids = JOB_ID.findall(model) + [f"ftjob-{m}" for m in CHECKPOINT_ID.findall(model)]
    for job_id in job_ids:
        try:
            store.get_job(owner, job_id)
        except NotFound:
            raise ApiError(
                400, f"{field}: no model {model!r}: it names a job that does not exist", "model_not_found", field
            ) from None
        raise ApiError(
            400,
            f"{field}: {model!r} is a fine-tuned model; starting a job from a fine-tuned model is not supported: "
            "use its base model",
            "model_not_supported",
            field,
        )


def tenant_config(config: ServiceConfig, owner: str, store: Store) -> ServiceConfig | None:
    """The config whose caps apply to ``owner``'s request, with the object-store prefixes the operator allowed
    that tenant, or None for the operator (no tenant checks)."""
    if is_operator(owner):
        return None
    prefixes = config.store_prefixes_for(owner, store.key_name(owner))
    return dataclasses.replace(config, tenant_store_prefixes=prefixes)
