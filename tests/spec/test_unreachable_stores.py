"""A dataset or output in an object store that cannot be reached fails in one line, without the store
library's retries or tracebacks (a closed port on 127.0.0.1 stands in for a store with no network to it)."""

from __future__ import annotations

import socket

import pytest
import yaml

from openrft import storage
from openrft.cli import main


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def fresh_probe_cache():
    storage._REACHED.clear()
    yield
    storage._REACHED.clear()


def recipe(tmp_path, data: str, **run) -> str:
    doc = {
        "run": {"model_name_or_path": "openrft-demo", "data_s3_path": data, **run},
        "training_config": {
            "rollout": {"rewards": {"preset_reward_function": "exact_match"}},
            "trainer": {"max_steps": 2},
        },
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize(
    ("uri", "variable"),
    [("s3://bucket/train.jsonl", "AWS_ENDPOINT_URL_S3"), ("gs://bucket/train.jsonl", "STORAGE_EMULATOR_HOST")],
)
def test_an_unreachable_dataset_is_one_line(tmp_path, monkeypatch, capsys, uri, variable):
    port = closed_port()
    monkeypatch.setenv(variable, f"http://127.0.0.1:{port}")
    path = recipe(tmp_path, uri)
    assert main(["spec", "validate", path]) == 0  # valid as written: the bucket is to map before it trains here
    out = capsys.readouterr().out.strip().splitlines()
    assert out[1] == (
        f"  - run.data_s3_path: {uri}: is unreachable: the object store 127.0.0.1:{port} does not "
        f"answer (Connection refused); map it to a local path (--map {uri}=PATH, or train --output DIR for an "
        f"output location), or set {variable}"
    )
    assert out[2] == f"to train here: openrft train {path} --map {uri}=PATH"
    assert main(["train", path, "--output", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{uri}: is unreachable" in err and "Traceback" not in err


def test_the_probe_is_bounded_well_under_five_seconds():
    assert storage.REACH_TIMEOUT_S <= 3


def test_an_unreachable_output_location_is_named(tmp_path, monkeypatch, capsys):
    port = closed_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
    path = recipe(tmp_path, str(tmp_path / "train.jsonl"), output_s3_path="s3://bucket/out/")
    (tmp_path / "train.jsonl").write_text(
        "".join(
            f'{{"messages": [{{"role": "user", "content": "q{i}"}}], "reference_answer": "{i}"}}\n' for i in range(60)
        )
    )
    assert main(["spec", "validate", path]) == 0
    out = capsys.readouterr().out
    unreachable = f"s3://bucket/out/: is unreachable: the object store 127.0.0.1:{port} does not answer"
    assert f"run.output_s3_path: {unreachable}" in out  # the recipe's own field
    assert out.splitlines()[-1] == f"to train here: openrft train {path} --output DIR"


def test_every_problem_at_once_datasets_and_outputs_included(tmp_path, monkeypatch, capsys):
    port = closed_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
    train = tmp_path / "train.jsonl"
    train.write_text('{"messages": [{"role": "user", "content": "q"}], "reference_answer": "1"}\n{oops\n')
    path = recipe(
        tmp_path, str(train), validation_data_s3_path="s3://bucket/val.jsonl", output_s3_path="s3://bucket/out/"
    )
    text = (tmp_path / "recipe.yaml").read_text().replace("max_steps: 2", "max_steps: 2\n    optim_config: {lr: -1}")
    (tmp_path / "recipe.yaml").write_text(text)
    assert main(["spec", "validate", path]) == 2
    err = capsys.readouterr().err
    assert f"4 problem(s) in {path}:" in err
    assert "training_config.trainer.optim_config.lr: -1 must be > 0" in err
    assert f"run.data_s3_path: {train}:2: <line>: is not valid JSON" in err
    assert "run.validation_data_s3_path: s3://bucket/val.jsonl: is unreachable" in err
    assert "run.output_s3_path: s3://bucket/out/: is unreachable" in err
