"""A job through the service's embedded worker gets learner processes of the server's machine (issue 51 point 1,
runtime/local_parallel.py), with the official OpenAI client: its events say how many and which layout each phase
kept, its metrics which layout each step ran in."""

from __future__ import annotations

import time

import openai
import psutil
import pytest

from tests.service.svc_helpers import TRAIN, VALIDATION, Service, small_dataset
from tests.service.test_azure_tools_job import submit_calculator_job
from tests.service.test_cluster import demo_job
from tests.tools.test_azure_tools import ToolServer
from tests.tools.test_azure_tools import tool_url as tool_url  # the fixture


@pytest.fixture
def service(tmp_path):
    svc = Service(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}")
    yield svc
    svc.stop_all()


def test_a_job_of_the_embedded_worker_runs_on_learner_processes_and_says_which_layout_each_phase_kept(
    service, tmp_path
):
    service.serve(workers=1)
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-local", max_retries=0)
    with small_dataset(tmp_path / "train.jsonl", TRAIN, 32).open("rb") as f:
        train = client.files.create(file=f, purpose="fine-tune")
    with small_dataset(tmp_path / "validation.jsonl", VALIDATION, 4).open("rb") as f:
        validation = client.files.create(file=f, purpose="fine-tune")
    # threads left to the engine; two processes asked for, so that a loaded CI machine (whose idle cores the engine
    # counts) still gets them
    job = demo_job(client, train.id, validation.id, eval_interval=8, threads=None, processes=2)
    deadline = time.monotonic() + 300
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(1)
    assert job.status == "succeeded", job.error

    events = list(client.fine_tuning.jobs.list_events(job.id, limit=200))
    messages = [e.message for e in events]
    assert any(m.startswith("2 learner processes (runtime.processes 2)") for m in messages), messages
    kept = sorted(m.split(":")[0] for m in messages if "from now on, the fastest per 1,000 tokens" in m)
    assert kept == ["generate", "learn"], messages
    steps = sorted((e.data["step"], e.data["metrics"]) for e in events if e.type == "metrics" and e.data["step"] > 0)
    layouts = [(m["perf/processes_generate"], m["perf/processes_learn"]) for _, m in steps[:4]]
    assert layouts == [(1.0, 1.0), (2.0, 2.0)] * 2  # a warm-up in each layout, then the trials
    # the processes ended with the job: none of the server's children is a learner process any more
    children = [p.cmdline() for p in psutil.Process(service.processes[-1].proc.pid).children(recursive=True)]
    assert not any("openrft.runtime.local_processes" in " ".join(c) for c in children), children


@pytest.mark.slow
def test_a_tools_job_of_the_embedded_worker_learns_on_learner_processes_and_runs_its_tools_here(
    service, tool_url, tmp_path
):
    """An OpenAI-dialect job with Azure's tool fields (the default independent schedule) through the official client,
    threads left to the engine: its learning steps are measured on the learner processes, its episodes are sampled in
    the job's process (where its tool calls are made), and the tool server sees the calls."""
    service.serve(workers=1)
    client = openai.OpenAI(base_url=service.base_url + "/v1", api_key="sk-local", max_retries=0)
    job = submit_calculator_job(client, tool_url, tmp_path, 16, eval_interval=4, openrft={"processes": 2})
    deadline = time.monotonic() + 300
    while (job := client.fine_tuning.jobs.retrieve(job.id)).status in ("validating_files", "queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(1)
    assert job.status == "succeeded", job.error
    events = list(client.fine_tuning.jobs.list_events(job.id, limit=200))
    messages = [e.message for e in events]
    assert any(m.startswith("2 learner processes (runtime.processes 2)") and "learning runs on" in m for m in messages)
    steps = sorted((e.data["step"], e.data["metrics"]) for e in events if e.type == "metrics" and e.data["step"] > 0)
    layouts = [(m["perf/processes_generate"], m["perf/processes_learn"]) for _, m in steps[:4]]
    assert layouts == [(1.0, 1.0), (1.0, 2.0)] * 2  # learning: a warm-up in each layout, then the trials
    assert ToolServer.calls, "the model never called the tool server"
