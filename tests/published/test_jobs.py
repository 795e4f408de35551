"""Every published job shape of the corpus resolves with the mappings a user passes, to the same JobSpec as
the job written with those local names (a mapping substitutes names and locations, nothing else), with the
values its service's rules give; ``spec explain`` says whose learning-rate rule applied."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from openrft.cli import main
from openrft.spec.dialects import read_document, resolve_document, resolve_job
from openrft.spec.mapping import apply_mappings
from openrft.spec.provenance import leaf_paths
from tests.published.jobs import DEMO, JOBS, PublishedJob

NAMES_ONLY = {"metadata": True}  # where a job keeps the cloud model's own name (Nova's model_type), by design


def mapped(job: PublishedJob):
    return resolve_job(
        job.path,
        mappings={"model_map": job.models, "lambda_map": job.lambdas},
        replacements=job.replace,
    )


def written_directly(job: PublishedJob, tmp_path: Path):
    document = copy.deepcopy(read_document(job.path))
    for dotted, value in job.direct.items():
        *parents, last = dotted.split(".")
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    path = tmp_path / job.file
    path.write_text(yaml.safe_dump(document) if job.file.endswith(".yaml") else json.dumps(document))
    return resolve_job(path)


@pytest.mark.parametrize("job", JOBS, ids=[j.file for j in JOBS])
def test_a_mapped_job_resolves_as_the_job_written_with_local_names(job, tmp_path):
    by_mapping, direct = mapped(job), written_directly(job, tmp_path)
    assert by_mapping.spec.model_dump(exclude=NAMES_ONLY) == direct.spec.model_dump(exclude=NAMES_ONLY)
    assert by_mapping.spec.model.name_or_path == DEMO
    assert not [w for w in by_mapping.warnings if "matches no value" in str(w)]  # every mapping was used


@pytest.mark.parametrize("job", JOBS, ids=[j.file for j in JOBS])
def test_a_published_job_resolves_to_its_services_values(job):
    values = leaf_paths(mapped(job).spec.model_dump(mode="json"))
    for path, expected in job.expect.items():
        assert values[path] == pytest.approx(expected), path


@pytest.mark.parametrize("job", JOBS, ids=[j.file for j in JOBS])
def test_a_published_job_validates_from_the_command_line(job, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENRFT_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")  # a judge endpoint (not called here)
    options = [*job.cli_options(), "--output", str(tmp_path / "run")]  # over the output location it may name
    assert main(["spec", "validate", str(job.path), *options]) == 0, capsys.readouterr().err
    assert "valid:" in capsys.readouterr().out


def test_explain_names_the_model_whose_rate_applied_and_the_option_that_changes_it(capsys):
    job = next(j for j in JOBS if j.file == "vertex_quickstart_cloud_run.json")
    assert main(["spec", "explain", str(job.path), *job.cli_options()]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "model.base_learning_rate" in x)
    assert "the base rate of openrft-demo, the model the job's 'gemini-3.5-flash' is mapped to" in line
    assert "Vertex's base rate for gemini-3.5-flash is not published" in line
    assert "openrft.base_learning_rate sets another" in line


def test_explain_names_the_cloud_model_whose_bedrock_limits_applied(capsys, tmp_path):
    job = next(j for j in JOBS if j.file == "bedrock_customization_job.json")
    assert main(["spec", "explain", str(job.path), *job.cli_options(), "--output", str(tmp_path), "--all"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "data.train_examples_limit" in x)
    assert "Bedrock's limit of 20K prompts for arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-2-lite" in line
    assert "kept for the model it is mapped to" in line


def test_the_base_rate_option_still_wins_over_the_mapped_models(tmp_path):
    job = next(j for j in JOBS if j.file == "openai_cookbook_score_model.json")
    document, _ = apply_mappings(read_document(job.path), job.replace)
    document["openrft"] = {"base_learning_rate": 1e-5, "model_map": job.models}
    resolution = resolve_document(document, base_dir=tmp_path, source=job.file)
    assert resolution.spec.optimizer.lr == pytest.approx(1e-5) and resolution.spec.model.name_or_path == DEMO


def test_a_template_left_without_a_dataset_says_where_to_write_it(capsys, tmp_path):
    job = next(j for j in JOBS if j.file == "nova_samples_rft_lora.yaml")
    document = read_document(job.path)
    document["run"]["data_s3_path"] = None  # as the sample repository publishes it, for its notebooks to fill in
    path = tmp_path / job.file
    path.write_text(yaml.safe_dump(document))
    assert main(["spec", "validate", str(path), *job.cli_options()]) == 0  # valid as written, a template
    out = capsys.readouterr().out.splitlines()
    line = next(x for x in out if "run.data_s3_path" in x)
    assert "is blank: the training dataset" in line and "write it in the recipe" in line
    assert out[-1].startswith(f"to train here: write run.data_s3_path, then openrft train {path}")
    assert main(["train", str(path), *job.cli_options(), "--output", str(tmp_path / "run"), "--quiet"]) == 2
    assert "run.data_s3_path: is blank" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def local_target(job: PublishedJob, option: str, name: str, tmp_path: Path) -> str | None:
    """What the corpus maps ``name`` to for ``option`` (the value a user puts for MODEL, PATH, HANDLER, DIR)."""
    if option == "--map-model":
        return job.models[name]
    if option == "--map":
        return job.replace[name]
    if option == "--map-lambda":
        return job.lambdas.get(name, job.lambdas.get("*"))
    return str(tmp_path / "run") if option == "--output" else None


@pytest.mark.parametrize("job", JOBS, ids=[j.file for j in JOBS])
def test_a_published_job_as_found_is_valid_and_its_one_line_trains_it(job, capsys, monkeypatch, tmp_path):
    """Unmapped, each job is valid as written (exit 0) and ends with the one command that trains it here; that
    command, its placeholders filled in with the corpus's local targets, makes a job that validates in full."""
    closed = "http://127.0.0.1:9"  # the buckets' stores do not answer, as on a machine without their cloud
    for variable in ("AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST"):
        monkeypatch.setenv(variable, closed)
    monkeypatch.setenv("OPENRFT_JUDGE_BASE_URL", f"{closed}/v1")
    assert main(["spec", "validate", str(job.path)]) == 0, capsys.readouterr().err
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"to train here: openrft train {job.path} "), last
    words = shlex.split(last.removeprefix("to train here: openrft train "))[1:]
    filled = []
    for option, value in zip(words[::2], words[1::2], strict=True):
        name, _, placeholder = value.rpartition("=")
        target = local_target(job, option, name, tmp_path)
        assert target, (option, value)
        filled += [option, f"{name}={target}" if name else target]
        assert placeholder in ("MODEL", "PATH", "HANDLER", "DIR"), value
    assert main(["spec", "validate", str(job.path), *filled]) == 0, capsys.readouterr().err
    assert "valid:" in capsys.readouterr().out


def test_a_job_with_a_real_problem_lists_it_with_what_to_map_and_fails(capsys, tmp_path):
    job = next(j for j in JOBS if j.file == "nova_hyperpod_lora_rft.yaml")
    document = read_document(job.path)
    document["training_config"]["trainer"]["optim_config"]["lr"] = -1
    path = tmp_path / job.file
    path.write_text(yaml.safe_dump(document))
    assert main(["spec", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "training_config.trainer.optim_config.lr: -1 must be > 0" in err
    assert "run.model_name_or_path: 'nova-lite-2/prod' is a model that runs only in its cloud service" in err


def test_what_to_map_in_json(capsys):
    job = next(j for j in JOBS if j.file == "openai_rft_guide_multi_grader.json")
    assert main(["spec", "validate", str(job.path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True and report["runnable"] is False
    assert [m["remedy"] for m in report["to_map"]] == [
        "--map-model 'o4-mini-2025-04-16=MODEL'",
        *(f"--map {file_id}=PATH" for file_id in job.replace),
    ]
    assert report["train_command"].startswith(f"openrft train {job.path} --map-model")
