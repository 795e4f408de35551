"""A Bedrock CreateModelCustomizationJob request runs with its cloud locations mapped like any other job's:
every S3 field maps with ``--map`` (the output directory too, even one that does not exist yet), an
unreachable location's error names ``--map``, and a local ``--output`` takes precedence over the request's
required ``outputDataConfig.s3Uri``, which ``spec explain`` says."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from openrft.cli import build_parser, main
from openrft.cli.spec import resolve_from_args
from openrft.engine.metrics import read_metrics
from openrft.engine.samples import read_samples
from tests.published.jobs import JOBS

JOB = next(j for j in JOBS if j.file == "bedrock_customization_job.json")
OUTPUT = "s3://corpus-bucket/rft-output/"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def unreachable_s3(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{closed_port()}")


def test_the_unmapped_output_location_is_named_with_the_option_to_map_it(unreachable_s3, capsys):
    """Valid as written (exit 0), with the output bucket to map before it trains here; train refuses it."""
    assert main(["spec", "validate", str(JOB.path), *JOB.cli_options()]) == 0
    out = capsys.readouterr().out
    assert f"outputDataConfig.s3Uri: {OUTPUT}: is unreachable" in out  # the request's own field
    assert f"--map {OUTPUT}=PATH, or train --output DIR for an output location" in out
    assert out.splitlines()[-1].endswith(" --output DIR"), out


def test_output_takes_precedence_and_explain_says_so(unreachable_s3, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["spec", "validate", str(JOB.path), *JOB.cli_options(), "--output", str(run)]) == 0
    capsys.readouterr()
    assert main(["spec", "explain", str(JOB.path), *JOB.cli_options(), "--output", str(run)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("output_dir"))
    assert "(from --output; " in line
    assert f"--output takes precedence over outputDataConfig.s3Uri '{OUTPUT}'" in line
    assert main(["spec", "explain", str(JOB.path), *JOB.cli_options(), "--output", str(run), "--json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["output_dir"] == str(run) and explained["provenance"]["output_dir"]["field"] == "--output"


def test_every_location_of_the_request_maps_relative_to_the_working_directory(unreachable_s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = [*JOB.cli_options(), f"--map={OUTPUT}=out/run-1"]
    assert main(["spec", "validate", str(JOB.path), *options]) == 0
    resolution = resolve_from_args(build_parser().parse_args(["spec", "explain", str(JOB.path), *options]))
    assert resolution.spec.output_dir == str(tmp_path / "out" / "run-1")  # not next to the job file
    assert resolution.spec.data.validation == JOB.replace["s3://corpus-bucket/rft-data/val.jsonl"]


def test_train_writes_to_output_and_nothing_to_the_request_location(unreachable_s3, tmp_path, capsys):
    """Two steps of the published request on the demo model, mapped as documented, with a local handler."""
    handler = tmp_path / "reward.py"
    handler.write_text(  # its optional metrics_list items are malformed (no name): dropped, counted, recorded
        "def lambda_handler(event, context):\n"
        "    return [{'id': s['id'], 'aggregate_reward_score': float(s['messages'][-1]['content'].strip() == "
        "str(s['reference_answer'])), 'metrics_list': [{'metric': 'accuracy', 'value': 0.0}]} for s in event]\n"
    )
    small = tmp_path / "train.jsonl"
    train = Path(JOB.replace["s3://corpus-bucket/rft-data/train.jsonl"])
    small.write_text("".join(train.read_text().splitlines(keepends=True)[:8]))
    options = [
        f"--map=s3://corpus-bucket/rft-data/train.jsonl={small}",
        f"--map=s3://corpus-bucket/rft-data/val.jsonl={small}",
        *(f"--map-model={k}={v}" for k, v in JOB.models.items()),
        f"--map-lambda=arn:aws:lambda:us-east-1:111122223333:function:corpus-reward={handler}:lambda_handler",
    ]
    run = tmp_path / "run"
    assert main(["train", str(JOB.path), *options, "--steps", "1", "--output", str(run), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "uploaded" not in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary.get("output_uri") is None
    step = next(row for row in read_metrics(run / "metrics.jsonl") if row.get("step") == 1 and "reward/warnings" in row)
    assert step["reward/warnings"] == step["reward/samples"] > 0 and step["reward/errors"] == 0
    trained = [r for r in read_samples(run) if r["kind"] == "train"]
    assert trained and all(r["warnings"] and r["warnings"][0].endswith("has no name; dropped") for r in trained)
