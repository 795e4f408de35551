"""MLflow tracking of a job: its params, every metric at its step, its recorded samples as tables, and the
final adapter as an artifact.

Used when the spec names a tracking URI (Nova's ``run.mlflow_tracking_uri``; Vertex labels and OpenAI
metadata ``mlflow_tracking_uri``). Any URI MLflow takes works: ``http://host:5000`` (``mlflow server``),
``sqlite:///mlflow.db``, ``file:///path/mlruns``, ``databricks``. A resumed job continues its MLflow run
(the run id is kept in the run directory). A tracking server that cannot be reached fails the job before
it trains; one that goes away during training costs a warning, not the job (metrics.jsonl has everything).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from openrft.calls.endpoints import sync_client
from openrft.calls.outbound import OutboundRefused
from openrft.calls.transport import use_for_mlflow
from openrft.errors import OpenRFTError
from openrft.spec.job import JobSpec
from openrft.spec.tools import masked_headers

RUN_FILE = "mlflow_run.json"
PARAMS_PER_BATCH = 100  # MLflow's limit per log_batch call
METRICS_PER_BATCH = 1000
PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value's length
CONNECT_TIMEOUT_S = 10.0
_NOT_ALLOWED = re.compile(r"[^\w\-./ ]")


def metric_key(name: str) -> str:
    """An OpenRFT metric name as MLflow allows it (letters, digits, ``_-./`` and space): ``@`` becomes ``_at_``,
    anything else not allowed ``_`` (``val-score/rewards/mean@1`` -> ``val-score/rewards/mean_at_1``)."""
    return _NOT_ALLOWED.sub(lambda m: "_at_" if m.group() == "@" else "_", name)


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts as dotted keys with string values, the way they are logged as MLflow params."""
    if isinstance(data, dict) and data:
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    text = json.dumps(data) if isinstance(data, list | dict) else str(data)
    return {prefix: text[:PARAM_VALUE_LIMIT]}


class MlflowError(OpenRFTError):
    """MLflow tracking that cannot start; names the tracking URI."""


def _require_mlflow(uri: str) -> None:
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise MlflowError(
            f"tracking.mlflow_tracking_uri is {uri!r}, but MLflow is not installed: pip install 'openrft[mlflow]'"
        ) from None


def _check_reachable(uri: str) -> None:
    """An HTTP tracking server answers at all (any status), within seconds: MLflow's own retries take minutes."""
    if urlparse(uri).scheme not in ("http", "https"):
        return
    import httpx

    try:
        with sync_client(timeout=CONNECT_TIMEOUT_S, follow_redirects=False) as client:
            client.get(uri)
    except (httpx.HTTPError, OutboundRefused) as exc:
        raise MlflowError(f"MLflow tracking server {uri} cannot be reached ({type(exc).__name__}: {exc})") from None


def _artifact_location(uri: str, experiment: str) -> str | None:
    """For a ``sqlite:`` store, artifacts next to the database file (MLflow's default is ``./mlruns`` of
    whatever directory the process runs in); for other stores, MLflow's own default."""
    parsed = urlparse(uri)
    if parsed.scheme != "sqlite" or not parsed.path or parsed.path == "/:memory:":
        return None
    database = Path(unquote(parsed.path[1:]))  # sqlite:///rel.db -> rel.db; sqlite:////abs.db -> /abs.db
    return (database.resolve().parent / "mlartifacts" / _NOT_ALLOWED.sub("_", experiment)).as_uri()


class MlflowTracker:
    """One MLflow run of one job. ``log_metrics`` is a ``MetricsSink`` listener."""

    def __init__(self, client: Any, run_id: str, uri: str, on_event: Callable[[str, str], None]):
        self.client = client
        self.run_id = run_id
        self.uri = uri
        self.on_event = on_event
        self._broken = False

    @classmethod
    def start(cls, spec: JobSpec, run_dir: Path, resume: bool, on_event: Callable[[str, str], None]) -> MlflowTracker:
        tracking = spec.tracking
        uri = tracking.mlflow_tracking_uri
        assert uri is not None
        _require_mlflow(uri)
        use_for_mlflow()  # a tenant's job: MLflow's sessions connect only to checked addresses
        _check_reachable(uri)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        run_file = run_dir / RUN_FILE
        try:
            if resume and run_file.exists():
                run_id = json.loads(run_file.read_text())["run_id"]
                client.update_run(run_id, status="RUNNING")
                return cls(client, run_id, uri, on_event)
            experiment = tracking.mlflow_experiment_name or spec.name
            found = client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id
                if found
                else client.create_experiment(experiment, artifact_location=_artifact_location(uri, experiment))
            )
            run = client.create_run(
                experiment_id,
                run_name=tracking.mlflow_run_name or spec.name,
                tags={
                    "openrft.dialect": spec.dialect,
                    "openrft.job_name": spec.name,
                    "openrft.run_dir": str(run_dir.resolve()),
                },
            )
            run_id = run.info.run_id
            flat = flatten(masked_headers(spec.model_dump(mode="json", exclude={"metadata"})))
            params = [Param(metric_key(k)[:250], v) for k, v in flat.items()]
            for i in range(0, len(params), PARAMS_PER_BATCH):
                client.log_batch(run_id, params=params[i : i + PARAMS_PER_BATCH])
        except MlflowError:
            raise
        except Exception as exc:
            raise MlflowError(f"MLflow at {uri} refused the run: {type(exc).__name__}: {exc}") from None
        run_file.write_text(json.dumps({"tracking_uri": uri, "experiment_id": experiment_id, "run_id": run_id}))
        on_event("info", f"MLflow run {run_id} in experiment {experiment!r} at {uri}")
        return cls(client, run_id, uri, on_event)

    def _call(self, what: str, fn: Callable[[], Any]) -> bool:
        """Run an MLflow call; a failure is one warning event, after which metrics are no longer sent."""
        if self._broken:
            return False
        try:
            fn()
            return True
        except Exception as exc:
            self._broken = True
            self.on_event(
                "warn",
                f"MLflow at {self.uri}: {what} failed ({type(exc).__name__}: {exc}); no more "
                "metrics are sent to it in this run (metrics.jsonl has them all)",
            )
            return False

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(metric_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), METRICS_PER_BATCH):
            self._call(
                f"logging step {step}",
                lambda part=batch[i : i + METRICS_PER_BATCH]: self.client.log_batch(self.run_id, metrics=part),
            )

    def log_samples(self, kind: str, step: int, records: list[dict[str, Any]]) -> None:
        """Recorded samples as an MLflow table, one per kind and step (``samples/train_step_000003.json``): a
        table per step keeps each call's upload the size of its step (MLflow appends to a table by rewriting it).
        """
        from openrft.engine.samples import flat_row

        rows = [flat_row(r) for r in records]
        columns = {name: [row[name] for row in rows] for name in rows[0]} if rows else {}
        artifact = f"samples/{kind}_step_{step:06d}.json"
        self._call(
            f"logging the samples of step {step}",
            lambda: self.client.log_table(self.run_id, data=columns, artifact_file=artifact),
        )

    def finish(self, status: str, adapter_dir: Path | None, files: tuple[Path, ...] = ()) -> None:
        """Upload the adapter (``adapter/``) and summary files, and close the run with the job's status."""
        if adapter_dir is not None and adapter_dir.is_dir():
            self._broken = False  # the artifact is worth another try even after a failed metric
            self._call(
                "uploading the adapter",
                lambda: self.client.log_artifacts(self.run_id, str(adapter_dir), artifact_path="adapter"),
            )
        for file in files:
            if file.is_file():
                self._call(f"uploading {file.name}", lambda f=file: self.client.log_artifact(self.run_id, str(f)))
        mlflow_status = {"succeeded": "FINISHED", "paused": "KILLED", "cancelled": "KILLED"}.get(status, "FAILED")
        self._broken = False
        self._call("closing the run", lambda: self.client.set_terminated(self.run_id, status=mlflow_status))
