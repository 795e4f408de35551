"""``openrft spec explain`` and ``openrft spec validate`` on job files of every dialect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from dialect_builders import nova_recipe, openai_job, vertex_request

from openrft.cli import main


def write(path, document) -> str:
    path.write_text(json.dumps(document) if path.suffix == ".json" else yaml.safe_dump(document))
    return str(path)


def test_explain_json_has_total_steps_at_the_top(data_dir, capsys):
    job = write(data_dir / "vertex.json", vertex_request({"batchSize": 16}))
    assert main(["spec", "explain", job, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_steps"] == 63 and out["training"]["total_steps"] == 63  # ceil(10 * 100 / 16)
    assert out["dialect"] == "vertex" and out["dataset_prompts"] == 100
    assert out["provenance"]["training.total_steps"] == {
        "origin": "derived",
        "field": "reinforcementTuningSpec.hyperParameters.epochCount",
        "note": "ceil(epochs × prompts / batchSize) = ceil(10 × 100 / 16) = 63",
    }
    assert out["provenance"]["training.prompts_per_step"]["origin"] == "user"
    assert out["provenance"]["sampling.samples_per_prompt"]["origin"] == "default"


def test_explain_prints_each_value_with_its_origin(data_dir, capsys):
    job = write(data_dir / "job.json", openai_job({"n_epochs": 2, "batch_size": 10}))
    assert main(["spec", "explain", job]) == 0
    out = capsys.readouterr().out
    assert "openai job openrft-job → 20 steps" in out
    assert "training.prompts_per_step = 10  user  (from method.reinforcement.hyperparameters.batch_size)" in out
    assert "sampling.samples_per_prompt = 16  default" in out
    assert "algorithm.clip_ratio_high" not in out
    main(["spec", "explain", job, "--all"])
    assert "algorithm.clip_ratio_high = 0.2  default  (OpenRFT default)" in capsys.readouterr().out


def test_explain_shows_warnings_and_a_forced_dialect(data_dir, capsys):
    job = write(data_dir / "job.json", vertex_request({"evaluateInterval": 3, "checkpointInterval": 4}))
    assert main(["spec", "explain", job]) == 0
    assert (
        "warning: reinforcementTuningSpec.hyperParameters.checkpointInterval: 4 is not a multiple"
        in capsys.readouterr().out
    )
    assert main(["spec", "explain", job, "--dialect", "openai"]) == 2
    err = capsys.readouterr().err
    assert "model: is required" in err and "reinforcementTuningSpec: is not a known field" in err


def test_explain_reports_all_problems(data_dir, capsys):
    job = write(data_dir / "recipe.yaml", nova_recipe({"global_batch_size": 512}, {"optim_config": {"lr": -1}}))
    assert main(["spec", "explain", job]) == 2
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "training_config.global_batch_size: 512 is outside [16, 256]" in err


def test_validate_a_good_job(data_dir, capsys):
    job = write(data_dir / "recipe.yaml", nova_recipe())
    assert main(["spec", "validate", job]) == 0
    assert "valid:" in capsys.readouterr().out
    assert main(["spec", "validate", job, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report | {"problems": []} == report and report["valid"] and report["total_steps"] == 10
    assert (report["train_examples"], report["validation_examples"]) == (100, 10)


def test_validate_reports_bad_lines_of_both_files(data_dir, capsys):
    with (data_dir / "train.jsonl").open("a") as f:
        f.write('{"messages": []}\n')
    (data_dir / "val.jsonl").write_text('{"messages": [{"role": "user", "content": "x"}]}\nnot json\n')
    job = write(data_dir / "recipe.yaml", nova_recipe())
    assert main(["spec", "validate", job, "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert problems == [
        f"{data_dir}/train.jsonl:101: messages: must be a non-empty list of {{role, content}} objects",
        f"{data_dir}/train.jsonl:101: reference_answer: is required by this job's reward",
        f"{data_dir}/val.jsonl:1: reference_answer: is required by this job's reward",
        f"{data_dir}/val.jsonl:2: <line>: is not valid JSON (Expecting value, column 1)",
    ]
    assert main(["spec", "validate", job]) == 2
    assert "is not a valid job: 4 problem(s)" in capsys.readouterr().err


@pytest.mark.parametrize("dialect", ["vertex", "openai"])
def test_validate_checks_the_datasets_of_every_dialect(data_dir, capsys, dialect):
    (data_dir / "val.jsonl").write_text("{}\n")
    document = vertex_request() if dialect == "vertex" else openai_job()
    job = write(data_dir / "job.json", document)
    assert main(["spec", "validate", job, "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert f"{data_dir}/val.jsonl:1: messages: is required" in problems


def test_explain_states_how_the_learner_is_laid_out(data_dir, capsys):
    sharded = vertex_request({"batchSize": 16}, openrft={"runtime": "ray", "learner_sharding": "fsdp"})
    job = write(data_dir / "sharded.json", sharded)
    assert main(["spec", "explain", job]) == 0
    out = capsys.readouterr().out
    assert "learner: LoRA, one policy sharded with FSDP2 over 1 Ray actors" in out
    assert "rollout.learner_sharding = fsdp  user  (from openrft.learner_sharding)" in out
    job = write(data_dir / "plain.json", vertex_request({"batchSize": 16}))
    assert main(["spec", "explain", job]) == 0
    out = capsys.readouterr().out  # threads unset: the engine measures each phase on the processes and alone
    assert "learner: LoRA, the job's learner and learner processes of this machine (one per core" in out
    assert "runs on all of them, data-parallel, or in the job's process alone, as measured faster" in out
    fixed = write(data_dir / "fixed.json", vertex_request({"batchSize": 16}, openrft={"processes": 2, "threads": 1}))
    assert main(["spec", "explain", fixed]) == 0
    assert "(2; runtime.processes), each a full copy of the policy, 1 thread(s) each" in capsys.readouterr().out
    one = write(data_dir / "one.json", vertex_request({"batchSize": 16}, openrft={"processes": 1}))
    assert main(["spec", "explain", one]) == 0
    assert "learner: LoRA, one learner holding the whole policy" in capsys.readouterr().out
    calculator = Path(__file__).resolve().parents[2] / "examples" / "calculator" / "recipe.yaml"
    recipe = yaml.safe_load(calculator.read_text())
    recipe["openrft"]["tools"]["schedule"] = "independent"  # one continuous decode batch of the job's process
    for key in ("model_name_or_path", "data_s3_path", "validation_data_s3_path"):
        recipe["run"][key] = str(calculator.parent / recipe["run"][key])
    function = recipe["openrft"]["tools"]["functions"]["calculator"]
    function["function"] = str(calculator.parent / function["function"])
    independent = write(data_dir / "independent.yaml", recipe)
    assert main(["spec", "explain", independent]) == 0
    out = capsys.readouterr().out
    assert "learner: LoRA, the job's learner and learner processes of this machine (one per core" in out
    assert "learning runs on all of them, data-parallel, or in the job's process alone" in out
    assert "the episodes are sampled in the job's process, in one continuous decode batch" in out
    assert main(["spec", "explain", str(calculator)]) == 0  # lockstep: each turn a batch the processes can share
    assert "each phase (sampling, learning) runs on all of them" in capsys.readouterr().out


def test_explain_states_the_generation_engine_and_the_rollout_correction(data_dir, capsys):
    job = write(data_dir / "plain.json", vertex_request({"batchSize": 16}))
    assert main(["spec", "explain", job]) == 0
    out = capsys.readouterr().out
    assert "generation: sync rollouts from the learner's own model, OpenRFT's sampler (rollout.engine auto)" in out
    assert "rollout correction off" in out
    served = vertex_request({"batchSize": 16}, openrft={"generator_base_url": "http://127.0.0.1:8000"})
    assert main(["spec", "explain", write(data_dir / "served.json", served)]) == 0
    out = capsys.readouterr().out
    assert "generation: sync rollouts from server(s) http://127.0.0.1:8000 (rollout.engine auto)" in out
    assert "rollout correction tis at token level, cap 2" in out
    mis = {"generator_base_url": "http://a:1", "rollout_correction": {"mode": "mis", "level": "sequence", "cap": 3}}
    assert main(["spec", "explain", write(data_dir / "mis.json", vertex_request({"batchSize": 16}, openrft=mis))]) == 0
    assert "rollout correction mis at sequence level, cap 3" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("openrft", "message"),
    [
        ({"generation_engine": "server"}, "rollout.engine 'server' needs rollout.generator_base_url"),
        (
            {"generation_engine": "local", "generator_base_url": "http://127.0.0.1:8000"},
            "rollout.generator_base_url ('http://127.0.0.1:8000') is set but rollout.engine is 'local'",
        ),
        ({"generation_engine": "vllm", "runtime": "ray"}, "rollout.engine 'vllm' (colocated in the learner's process)"),
        (
            {"generation_engine": "vllm", "learner_sharding": "fsdp"},
            "rollout.engine 'vllm' (colocated in the learner's process) needs one learner holding the whole policy",
        ),
        ({"rollout_correction": {"cap": 1.0}}, "rollout_correction.cap"),
    ],
)
def test_an_engine_without_what_it_needs_is_refused_by_name(data_dir, capsys, openrft, message):
    job = write(data_dir / "bad.json", vertex_request({"batchSize": 16}, openrft=openrft))
    assert main(["spec", "validate", job]) != 0
    captured = capsys.readouterr()
    assert message in captured.out + captured.err
