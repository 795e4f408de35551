"""MLflow tracking read back through ``mlflow.MlflowClient``: a ``sqlite:`` store and a real ``mlflow server``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from openrft.cli import main
from openrft.engine.metrics import read_metrics
from openrft.engine.mlflow_tracking import RUN_FILE, flatten, metric_key
from openrft.engine.samples import read_samples
from openrft.spec.dialects import parse_document
from tests.monitoring.servers import free_port, mlflow_server
from tests.spec.dialect_builders import Sizes, openai_job, vertex_request

mlflow = pytest.importorskip("mlflow")


def test_metric_keys_are_what_mlflow_accepts():
    assert metric_key("val-score/rewards/mean@1") == "val-score/rewards/mean_at_1"
    assert metric_key("critic/rewards/mean") == "critic/rewards/mean"
    assert metric_key("reward/errors/timeout") == "reward/errors/timeout"
    assert metric_key("a:b(c)") == "a_b_c_"
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": {}}) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "d": "None",
        "e": "{}",
    }


def test_vertex_labels_and_openai_metadata_carry_the_mlflow_settings():
    settings = {
        "mlflow_tracking_uri": "http://127.0.0.1:5000",
        "mlflow_experiment_name": "exp",
        "mlflow_run_name": "run-1",
    }
    vertex = parse_document(vertex_request(labels=settings), dataset_size=Sizes(100))
    openai = parse_document(openai_job(metadata=settings), dataset_size=Sizes(100))
    for spec in (vertex, openai):
        assert spec.tracking.mlflow_tracking_uri == "http://127.0.0.1:5000"
        assert spec.tracking.mlflow_experiment_name == "exp" and spec.tracking.mlflow_run_name == "run-1"
    plain = parse_document(openai_job(metadata={"team": "x"}), dataset_size=Sizes(100))
    assert plain.tracking.mlflow_tracking_uri is None


def _check_run(client, experiment: str, run_name: str, run_dir: Path, steps: int) -> None:
    """The run holds the params, every metric of metrics.jsonl at its step, and the adapter as an artifact."""
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == run_name and run.info.status == "FINISHED"
    assert json.loads((run_dir / RUN_FILE).read_text())["run_id"] == run.info.run_id
    assert run.data.params["training.total_steps"] == str(steps)
    assert run.data.params["model.name_or_path"] == "openrft-demo"
    assert run.data.tags["openrft.dialect"] == "nova"

    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(steps + 1))
    for name in ("critic/rewards/mean", "val-score/rewards/mean@1", "actor/kl", "actor/pg_loss"):
        history = client.get_metric_history(run.info.run_id, metric_key(name))
        expected = [(r["step"], r[name]) for r in rows if name in r]
        assert sorted((m.step, m.value) for m in history) == expected, name
    logged = set(run.data.metrics)
    assert logged == {metric_key(k) for r in rows for k in r if k != "step"}

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "adapter")}
    assert {"adapter/adapter_model.safetensors", "adapter/adapter_config.json"} <= artifacts
    local = Path(client.download_artifacts(run.info.run_id, "adapter/adapter_model.safetensors", str(run_dir.parent)))
    assert local.read_bytes() == (run_dir / "adapter" / "adapter_model.safetensors").read_bytes()
    assert {"manifest.json", "summary.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}

    # the recorded samples as tables, one per kind and step, equal to the run directory's samples
    tables = {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    evaluated = [r["step"] for r in rows if "val-score/rewards/mean@1" in r]
    assert tables == {f"samples/train_step_{s:06d}.json" for s in range(1, steps + 1)} | {
        f"samples/eval_step_{s:06d}.json" for s in evaluated
    }
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, f"samples/eval_step_{steps:06d}.json")).read_text()
    )
    recorded = [r for r in read_samples(run_dir) if r["kind"] == "eval" and r["step"] == steps]
    columns = table["columns"]
    assert [row[columns.index("response")] for row in table["data"]] == [r["response"] for r in recorded]
    assert [row[columns.index("reward")] for row in table["data"]] == [r["reward"] for r in recorded]


@pytest.mark.slow
def test_sqlite_store_gets_params_metrics_and_adapter(demo_recipe, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recipe = demo_recipe(
        run={"mlflow_tracking_uri": uri, "mlflow_experiment_name": "arith", "mlflow_run_name": "sqlite-run"},
        trainer={"max_steps": 2},
    )
    run_dir = tmp_path / "run"
    assert main(["train", str(recipe), "--output", str(run_dir), "--quiet"]) == 0
    _check_run(mlflow.MlflowClient(uri), "arith", "sqlite-run", run_dir, steps=2)
    assert (tmp_path / "mlartifacts" / "arith").is_dir()  # artifacts beside the database, not in the cwd


@pytest.mark.slow
def test_mlflow_server_on_loopback(demo_recipe, tmp_path):
    with mlflow_server(tmp_path / "server", tmp_path / "mlflow.log") as uri:
        recipe = demo_recipe(
            run={"mlflow_tracking_uri": uri, "mlflow_experiment_name": "served", "mlflow_run_name": "server-run"},
            trainer={"max_steps": 2},
        )
        run_dir = tmp_path / "run"
        assert main(["train", str(recipe), "--output", str(run_dir), "--quiet"]) == 0
        _check_run(mlflow.MlflowClient(uri), "served", "server-run", run_dir, steps=2)
    assert any((tmp_path / "server" / "artifacts").rglob("adapter_model.safetensors"))  # stored by the server


def test_unreachable_tracking_server_fails_fast_naming_it(demo_recipe, tmp_path, capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    recipe = demo_recipe(run={"mlflow_tracking_uri": uri})
    started = time.monotonic()
    assert main(["train", str(recipe), "--output", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"MLflow tracking server {uri} cannot be reached" in err
    assert time.monotonic() - started < 60
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_a_resumed_job_continues_its_mlflow_run(demo_recipe, tmp_path):
    from openrft.engine import RFTJob, StopAfter
    from openrft.spec.dialects import load_job

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = load_job(demo_recipe(run={"mlflow_tracking_uri": uri}, trainer={"max_steps": 2}))
    run_dir = tmp_path / "run"
    assert RFTJob(spec, run_dir, show_progress=False, control=StopAfter(1)).run()["status"] == "paused"
    client = mlflow.MlflowClient(uri)
    run_id = json.loads((run_dir / RUN_FILE).read_text())["run_id"]
    assert client.get_run(run_id).info.status == "KILLED"
    assert RFTJob.from_run_dir(run_dir, show_progress=False).run()["status"] == "succeeded"
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    history = client.get_metric_history(run_id, "critic/rewards/mean")
    assert sorted(m.step for m in history) == [1, 2]
