"""Jobs that drive the user's own agent, in processes of its own: examples/own_agent's agent trains through the
routes, and an agent killed mid-trajectory is counted while the job goes on (the calculator model, small)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from openrft.engine import RFTJob
from openrft.engine.samples import read_samples
from openrft.spec.dialects import load_job
from tests.tools.agent_harness import Entrypoint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own_agent"
CALCULATOR = ROOT / "examples" / "calculator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_recipe(tmp_path: Path, url: str, steps: int = 2, **agent) -> Path:
    """examples/own_agent's recipe, small: 4 prompts x 4 trajectories a step, 4 validation rows."""
    recipe = yaml.safe_load((EXAMPLE / "recipe.yaml").read_text())
    recipe["run"]["model_name_or_path"] = str(CALCULATOR / "model")
    recipe["run"]["data_s3_path"] = str(CALCULATOR / "train.jsonl")
    recipe["run"]["validation_data_s3_path"] = str(CALCULATOR / "validation.jsonl")
    del recipe["run"]["output_s3_path"]
    config = recipe["training_config"]
    config["global_batch_size"] = 16
    config["rollout"]["advantage_strategy"]["number_generation"] = 4
    config["trainer"].update(max_steps=steps, save_steps=steps, test_steps=100)
    recipe["openrft"].update(eval_max_examples=4, threads=1, tensorboard=False)
    recipe["openrft"]["agent"].update(url=url, **agent)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_examples_agent_in_its_own_process_trains_through_the_routes(tmp_path):
    port = free_port()
    agent = subprocess.Popen([sys.executable, "serve.py", "--port", str(port)], cwd=EXAMPLE, stdout=subprocess.PIPE)
    try:
        assert b"agent entrypoint on" in agent.stdout.readline()
        spec = load_job(agent_recipe(tmp_path, f"http://127.0.0.1:{port}/"))
        summary = RFTJob(spec, tmp_path / "run", show_progress=False).run()
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    assert summary["status"] == "succeeded"
    metrics = rows(tmp_path / "run")
    steps = [r for r in metrics if "tools/turns/mean" in r]
    assert len(steps) == 2 and all(r["tools/failed_episodes"] == 0 for r in steps)
    assert all(r["actor/trained_tokens"] > 0 for r in steps)
    records = list(read_samples(tmp_path / "run"))
    assert records and all(r["turns"] and r["turns"][0]["role"] == "assistant" for r in records)
    assert not (tmp_path / "run" / "agent_routes.json").exists()  # the routes' token gone with the routes


KILLED_AGENT = """
import json, os, signal, sys, urllib.request
request = json.loads(sys.stdin.read())
body = {"model": "m", "messages": request["row"]["messages"], "tools": request["row"]["tools"]}
sample = urllib.request.Request(
    request["base_url"] + "/chat/completions", json.dumps(body).encode(),
    {"Authorization": "Bearer " + request["api_key"], "Content-Type": "application/json"},
)
urllib.request.urlopen(sample).read()
if request["sample_index"] == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # killed mid-trajectory, its first turn sampled
print(json.dumps({"answer": "done"}))
"""


@pytest.mark.slow
def test_an_agent_killed_mid_trajectory_is_counted_and_the_job_goes_on(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(KILLED_AGENT)

    def in_its_own_process(request: dict) -> str:
        done = subprocess.run([sys.executable, str(script)], input=json.dumps(request), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the agent's process ended with {done.returncode}")
        return json.loads(done.stdout)["answer"]

    entrypoint = Entrypoint(in_its_own_process)
    try:
        recipe = agent_recipe(tmp_path, entrypoint.url, max_retries=0, error_budget=0.75)
        summary = RFTJob(load_job(recipe), tmp_path / "run", show_progress=False).run()
    finally:
        entrypoint.shutdown()
        entrypoint.server_close()
    assert summary["status"] == "succeeded"
    metrics = rows(tmp_path / "run")
    steps = [r for r in metrics if "actor/pg_loss" in r]
    assert len(steps) == 2  # both steps trained
    for row in steps:  # each prompt's second trajectory was killed: counted, left out, never a 0
        assert row["tools/episode_errors/agent_error"] == 4 == row["tools/failed_episodes"]
        assert row["reward/errors/agent_error"] == 4 and row["reward/excluded"] == 4
    assert os.path.exists(tmp_path / "run" / "adapter")


@pytest.mark.slow
def test_off_policy_async_rollouts_drive_the_agent_within_the_age_tolerance(tmp_path):
    port = free_port()
    agent = subprocess.Popen([sys.executable, "serve.py", "--port", str(port)], cwd=EXAMPLE, stdout=subprocess.PIPE)
    try:
        assert b"agent entrypoint on" in agent.stdout.readline()
        path = agent_recipe(tmp_path, f"http://127.0.0.1:{port}/", steps=3)
        recipe = yaml.safe_load(path.read_text())
        recipe["training_config"]["rollout"]["rollout_strategy"] = {"type": "off_policy_async", "age_tolerance": 1}
        path.write_text(yaml.safe_dump(recipe))
        summary = RFTJob(load_job(path), tmp_path / "run", show_progress=False).run()
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    assert summary["status"] == "succeeded"
    steps = [r for r in rows(tmp_path / "run") if "rollout/policy_age/max" in r]
    assert len(steps) == 3 and all(r["tools/failed_episodes"] == 0 for r in steps)
    assert all(r["rollout/policy_age/max"] <= 1 for r in steps)
    assert any(r["rollout/policy_age/max"] == 1 for r in steps)  # ahead of the learner, as built-in rollouts
