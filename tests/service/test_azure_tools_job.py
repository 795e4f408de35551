"""An OpenAI-dialect job with Azure's agentic tool fields, submitted through the official ``openai`` client,
runs on the calculator model and calls our tool server (tests/tools/test_azure_tools.py has the contract)."""

from __future__ import annotations

import json
import time

import pytest

from tests.tools.test_azure_tools import EXAMPLE, SECRET, ToolServer
from tests.tools.test_azure_tools import tool_url as tool_url  # the fixture


def submit_calculator_job(client, tool_url: str, tmp_path, rows: int, eval_interval: int, openrft: dict):
    """The calculator example's first ``rows`` rows (and 4 more for validation) uploaded with the official client,
    and an OpenAI-dialect job with Azure's tool fields on them: batches of 4, episodes of up to 3 model turns."""
    lines = (EXAMPLE / "train.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "train.jsonl").write_text("".join(lines[:rows]))
    (tmp_path / "validation.jsonl").write_text("".join(lines[rows : rows + 4]))
    files = {}
    for name in ("train", "validation"):
        with (tmp_path / f"{name}.jsonl").open("rb") as f:
            files[name] = client.files.create(file=f, purpose="fine-tune")
    return client.fine_tuning.jobs.create(
        model=str(EXAMPLE / "model"),
        training_file=files["train"].id,
        validation_file=files["validation"].id,
        method={
            "type": "reinforcement",
            "reinforcement": {
                "grader": {
                    "type": "string_check",
                    "name": "answer",
                    "input": "{{sample.output_text}}",
                    "reference": "{{item.reference_answer}}",
                    "operation": "eq",
                },
                "tools": [{"name": "calculator", "server_url": tool_url, "headers": {"X-Functions-Key": SECRET}}],
                "max_episode_steps": 3,
                "hyperparameters": {
                    "n_epochs": 1,
                    "batch_size": 4,
                    "compute_multiplier": 0.25,
                    "eval_interval": eval_interval,
                },
            },
        },
        extra_body={"openrft": {"max_new_tokens": 112, "eval_max_examples": 4, "tensorboard": False, **openrft}},
    )


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_azure_agentic_job_through_the_openai_client_calls_the_tool_server(service, tool_url, tmp_path):
    """The official client submits the job (operator mode: a loopback tool server is allowed); 2 steps run on the
    calculator model, the server saw its calls with the tenant's headers, and no event carries the token."""
    import openai

    service.serve(workers=1)
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-local", max_retries=0)
    job = submit_calculator_job(client, tool_url, tmp_path, 8, eval_interval=1, openrft={"threads": 1})
    deadline = time.monotonic() + 240
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.5)
    assert job.status == "succeeded", job.error
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    steps = sorted(e.data["step"] for e in events if e.type == "metrics")
    assert steps == [0, 1, 2]
    assert ToolServer.calls, "the model never called the tool server"
    assert all(c["headers"]["x-functions-key"] == SECRET for c in ToolServer.calls)
    assert all(c["body"]["type"] == "function_call" for c in ToolServer.calls)
    assert SECRET not in json.dumps([e.model_dump() for e in events])


def test_a_tenants_tool_server_url_passes_the_outbound_policy_named_by_its_field(tmp_path):
    """``server_url`` is a tenant's address: on a loopback, link-local or private address it is refused (400)
    naming the entry's field, as every other URL a tenant writes (docs/service.md, Security)."""
    from fastapi.testclient import TestClient

    from openrft.service.app import create_app
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    config = ServiceConfig.build(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    store = Store.open(config.database_url)
    try:
        _, key = store.create_key("alice")
        with TestClient(create_app(config, store), headers={"Authorization": f"Bearer {key}"}) as client:
            train = client.post(
                "/v1/files",
                files={"file": ("t.jsonl", (EXAMPLE / "train.jsonl").read_bytes())},
                data={"purpose": "fine-tune"},
            ).json()["id"]
            tools = [
                {"name": "search", "server_url": "https://93.184.216.34/tools", "headers": {"k": SECRET}},
                {"name": "calculator", "server_url": "http://169.254.169.254/latest", "headers": {"k": SECRET}},
            ]
            grader = {"type": "string_check", "name": "x", "input": "a", "reference": "a", "operation": "eq"}
            body = {
                "model": "openrft-demo",
                "training_file": train,
                "method": {"type": "reinforcement", "reinforcement": {"grader": grader, "tools": tools}},
            }
            response = client.post("/v1/fine_tuning/jobs", json=body)
    finally:
        store.close()
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "method.reinforcement.tools[1].server_url", error
    assert "169.254.169.254" in error["message"] and SECRET not in response.text
