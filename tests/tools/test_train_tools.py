"""Jobs with tools end to end on the calculator model: sync and off_policy_async, metrics, exact resume."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from openrft.engine import RFTJob, StopAfter
from openrft.engine.checkpoints import CheckpointManager
from openrft.engine.samples import read_samples
from openrft.spec.dialects import load_job
from tests.local_ray import own_ray_cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator"


def tools_recipe(tmp_path: Path, strategy: str = "sync", **openrft) -> Path:
    """The calculator example, small: 4 prompts x 4 episodes a step."""
    recipe = yaml.safe_load((EXAMPLE / "recipe.yaml").read_text())
    recipe["run"]["model_name_or_path"] = str(EXAMPLE / "model")
    recipe["run"]["data_s3_path"] = str(EXAMPLE / "train.jsonl")
    recipe["run"]["validation_data_s3_path"] = str(EXAMPLE / "validation.jsonl")
    del recipe["run"]["output_s3_path"]
    config = recipe["training_config"]
    config["global_batch_size"] = 16
    config["rollout"]["advantage_strategy"]["number_generation"] = 4
    if strategy != "sync":
        config["rollout"]["rollout_strategy"] = {"type": strategy, "age_tolerance": 1}
    config["trainer"].update(max_steps=3, save_steps=1, test_steps=100)
    recipe["openrft"].update({"eval_max_examples": 8, "threads": 1, "tensorboard": False, **openrft})
    recipe["openrft"]["tools"]["functions"]["calculator"]["function"] = f"{EXAMPLE / 'calculator.py'}:calculator"
    recipe["openrft"]["tools"]["functions"]["calculator"]["sandboxed"] = False
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def adapter_at(run_dir: Path, step: int) -> dict:
    manager = CheckpointManager(run_dir, 10)
    info = next(i for i in manager.list() if i.step == step)
    return manager.load_state(info)["learner"]["adapter"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sync", "off_policy_async"])
def test_a_job_with_tools_trains_on_episodes(tmp_path, strategy):
    spec = load_job(tools_recipe(tmp_path, strategy))
    summary = RFTJob(spec, tmp_path / "run", show_progress=False).run()
    assert summary["status"] == "succeeded"
    steps = rows(tmp_path / "run")[1:]
    for row in steps:
        assert row["tools/turns/mean"] >= 1.0 and "tools/masked_tokens/total" in row
    called = [r for r in steps if r["tools/calls/total"] > 0]
    assert called, "the calculator model calls its tool in some episodes"
    row = called[0]
    assert row["tools/calculator/calls"] == row["tools/calls/total"]
    assert row["tools/masked_tokens/total"] > 0 and row["tools/calculator/latency_s/mean"] >= 0
    assert row["tools/failed_episodes"] == 0.0
    # the learner trains on the model's tokens only: fewer than the episodes hold
    assert row["actor/trained_tokens"] < row["response_length/mean"] * 16
    evaluation = rows(tmp_path / "run")[0]  # validation episodes are tool episodes too
    assert evaluation["val-score/tools/turns/mean"] >= 1.0 and "val-score/tools/calls/mean" in evaluation
    # the recorded samples hold each episode's turns: the model's calls and the tool's results
    records = list(read_samples(tmp_path / "run"))
    turns = [m for r in records if r["turns"] for m in r["turns"]]
    assert any(m["role"] == "assistant" and m.get("tool_calls") for m in turns)
    assert any(m["role"] == "tool" for m in turns)
    for row in steps:  # the recorded prompts' policy ages are among the step's
        ages = [r["policy_age"] for r in records if r["kind"] == "train" and r["step"] == row["step"]]
        assert ages and min(ages) >= 0 and max(ages) <= row["rollout/policy_age/max"]


@pytest.mark.slow
def test_a_job_with_tools_resumes_from_a_checkpoint_exactly(tmp_path):
    spec = load_job(tools_recipe(tmp_path))
    straight = tmp_path / "straight"
    RFTJob(spec, straight, show_progress=False).run()
    interrupted = tmp_path / "interrupted"
    first = RFTJob(spec, interrupted, show_progress=False, control=StopAfter(1)).run()
    assert first["status"] == "paused"
    second = RFTJob.from_run_dir(interrupted, show_progress=False).run()
    assert second["status"] == "succeeded" and second["steps"] == 3
    expected, resumed = adapter_at(straight, 3), adapter_at(interrupted, 3)
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name
    for a, b in zip(rows(straight), rows(interrupted), strict=True):
        assert a["step"] == b["step"]
        for key in ("tools/calls/total", "tools/masked_tokens/total", "critic/rewards/mean"):
            assert a.get(key) == b.get(key), (a["step"], key)


def test_tool_files_are_found_next_to_the_job_file():
    spec = load_job(EXAMPLE / "recipe.yaml")
    assert spec.tools.functions["calculator"].function == f"{EXAMPLE / 'calculator.py'}:calculator"
    assert spec.tools.max_turns == 3


@pytest.mark.slow
def test_an_openai_job_with_a_tool_call_grader_trains_on_episodes(tmp_path):
    """OpenAI's dialect: the rows' tools, graders reading sample.output_tools, the openrft.tools block."""
    grader = {
        "type": "multi",
        "name": "used_and_right",
        "calculate_output": "0.5 * tool + 0.5 * answer",
        "graders": {
            "tool": {
                "type": "string_check",
                "name": "tool",
                "input": "{{sample.output_tools[0].function.name}}",
                "reference": "calculator",
                "operation": "eq",
            },
            "answer": {
                "type": "string_check",
                "name": "answer",
                "input": "{{sample.output_text}}",
                "reference": "{{item.reference_answer}}",
                "operation": "eq",
            },
        },
    }
    job = {
        "model": str(EXAMPLE / "model"),
        "training_file": str(EXAMPLE / "train.jsonl"),
        "validation_file": str(EXAMPLE / "validation.jsonl"),
        "method": {
            "type": "reinforcement",
            "reinforcement": {"grader": grader, "hyperparameters": {"n_epochs": 1, "batch_size": 4, "eval_samples": 4}},
        },
        "openrft": {
            "max_train_examples": 8,
            "eval_max_examples": 8,
            "max_new_tokens": 112,
            "max_length": 192,
            "threads": 1,
            "tensorboard": False,
            "on_reward_error": "zero",  # an episode without a call has no output_tools[0]: an error, scored 0
            "tools": {
                "functions": {
                    "calculator": {
                        "type": "python",
                        "function": f"{EXAMPLE / 'calculator.py'}:calculator",
                        "sandboxed": False,
                    }
                }
            },
        },
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    summary = RFTJob(load_job(path), tmp_path / "run", show_progress=False).run()
    assert summary["status"] == "succeeded"
    steps = rows(tmp_path / "run")[1:]
    row = steps[0]
    # every episode that called the calculator is scored (its tool half is 1); one that did not has no
    # output_tools[0]: an invalid_output error, counted, scored 0 by on_reward_error: zero
    called = row["tools/episodes_with_calls"] * row["reward/samples"]
    assert called > 0 and row["reward/scored"] == called and row["reward/tool/mean"] == 1.0
    assert row["reward/errors/invalid_output"] == row["reward/samples"] - called


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for this module's Ray jobs (each job kills its actors when it ends)."""
    pytest.importorskip("ray")
    src = str(Path(__file__).resolve().parents[2] / "src")  # the actors run this checkout's code
    yield from own_ray_cluster(2, log_to_driver=True, runtime_env={"env_vars": {"PYTHONPATH": src}})


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["sync", "off_policy_async"])
def test_a_job_with_tools_runs_on_a_local_ray_cluster(ray_cluster, tmp_path, strategy):
    """The learner and generation replicas are Ray actors; each turn is sampled there, the tools run here."""
    from openrft.runtime import runtime_for

    spec = load_job(tools_recipe(tmp_path, strategy, runtime="ray"))
    spec.training.total_steps = 2
    summary = RFTJob(spec, tmp_path / "run", show_progress=False, runtime=runtime_for(spec)).run()
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    steps = rows(tmp_path / "run")[1:]
    assert any(r["tools/calls/total"] > 0 and r["tools/masked_tokens/total"] > 0 for r in steps)
    assert all(r["tools/failed_episodes"] == 0.0 for r in steps)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["independent", "lockstep"])
def test_a_job_with_tools_left_to_choose_measures_its_phases_on_the_processes_where_they_can_run(
    tmp_path, monkeypatch, schedule
):
    """Issue 51 point 1 for tool jobs, threads unset: learning is measured on the learner processes and alone. The
    independent schedule's episodes decode in one continuous batch of the job's process; lockstep turns are batches
    the processes share. The tools run in the job's process either way."""
    import psutil

    import openrft.engine.setup as setup
    from openrft.rollout.local import TransformersGenerator
    from openrft.runtime import runtime_for
    from openrft.runtime.local_parallel import LocalParallelRuntime

    monkeypatch.setattr(setup, "configure_threads", lambda threads, measured=False: threads or 2)  # 2 idle cores
    decodings = []
    decoding = TransformersGenerator.decoding

    def counted(self, *args, **kwargs):
        decodings.append(os.getpid())
        return decoding(self, *args, **kwargs)

    monkeypatch.setattr(TransformersGenerator, "decoding", counted)
    path = tools_recipe(tmp_path, threads=None)
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"]["tools"]["schedule"] = schedule
    recipe["training_config"]["trainer"]["max_steps"] = 7
    path.write_text(yaml.safe_dump(recipe))
    spec = load_job(path)
    events: list[str] = []
    runtime = runtime_for(spec, lambda level, message: events.append(message))
    assert isinstance(runtime, LocalParallelRuntime)
    layouts, helper_cpu = [], []

    def listener(step: int, metrics: dict) -> None:
        if step > 0:
            layouts.append((metrics["perf/processes_generate"], metrics["perf/processes_learn"]))
            times = psutil.Process(runtime._learner.others[0].pid).cpu_times()
            helper_cpu.append(times.user + times.system)

    job = RFTJob(
        spec,
        tmp_path / "run",
        runtime=runtime,
        show_progress=False,
        listeners=(listener,),
        on_event=lambda level, message: events.append(message),
    )
    assert job.run()["status"] == "succeeded"
    here = schedule == "independent"
    # a warm-up alone and on the processes, then 2 trials each, interleaved; sampling on them too with lockstep
    assert layouts[:6] == ([(1.0, 1.0), (1.0, 2.0)] if here else [(1.0, 1.0), (2.0, 2.0)]) * 3
    chosen = {m.split(":")[0]: m for m in events if "from now on, the fastest per 1,000 tokens" in m}
    assert "2 processes at 1 thread each" in chosen["learn"]
    assert ("processes" not in chosen["generate"]) == here
    grew = [after - before for before, after in itertools.pairwise(helper_cpu)]  # steps 2-6: the helper worked
    assert grew[0] >= 0.03 and grew[2] >= 0.03 and grew[1] <= 0.01 and grew[3] <= 0.01, grew  # in steps 2 and 4
    assert set(decodings) == ({os.getpid()} if here else set())  # continuous batches here, lockstep none
    steps = rows(tmp_path / "run")[1:]
    assert any(r["tools/calls/total"] > 0 and r["tools/masked_tokens/total"] > 0 for r in steps)
    assert all(r["tools/failed_episodes"] == 0.0 for r in steps)
