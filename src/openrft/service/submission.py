"""Job submission: the dialect parser and dataset validation run before a job is queued.

Every problem comes back as a 400 naming the user's own field path. Datasets are named by file id
(``training_file: file-abc``, or a file id in Vertex's ``trainingDatasetUri`` / Nova's
``run.data_s3_path``); on a server with API keys, server-side paths are refused for data and models.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openrft.calls.outbound import OutboundPolicy, applying
from openrft.data.loader import DatasetError
from openrft.errors import OpenRFTError, RewardError
from openrft.service.admission import refuse_if_never_fits
from openrft.service.config import ServiceConfig
from openrft.service.dialect_fields import get_field as _get
from openrft.service.dialect_fields import set_field as _set
from openrft.service.errors import ApiError, check_request_document, from_dataset_error, from_spec_error
from openrft.service.mcp_registry import resolve_registered
from openrft.service.quotas import refuse_if_over_quota
from openrft.service.store import Store
from openrft.service.store.base import new_id
from openrft.service.store.models import Job
from openrft.service.tenancy import check_model_reference, is_operator, job_problems, raise_problems, tenant_config
from openrft.spec.dialects import parse_document
from openrft.spec.dialects.registry import fields as dialect_fields
from openrft.spec.errors import FieldProblem, SpecError
from openrft.spec.job import JobSpec
from openrft.spec.locations import is_remote


@dataclass
class Prepared:
    spec: JobSpec
    document: dict[str, Any]


class Submitter:
    def __init__(self, store: Store, config: ServiceConfig):
        self.store = store
        self.config = config

    def allow_server_paths(self, owner: str) -> bool:
        """Server-side paths are the single user's own on a loopback server with no API keys."""
        return is_operator(owner) and self.config.loopback_only

    def file_path(self, owner: str, file_id: str, field: str) -> str:
        row = self.store.get_file(owner, file_id)
        if row is None:
            raise ApiError(
                400,
                f"{field}: no file {file_id!r}: upload it with POST /v1/files (purpose fine-tune)",
                "invalid_file",
                field,
            )
        return str(self.config.files_dir / row.storage_name)

    def prepare(self, owner: str, document: dict[str, Any], dialect: str) -> Prepared:
        """Parse and validate; raises ApiError (400) naming the field paths."""
        check_request_document(document, "the job")
        document = _copy(document)
        self._check_lambda_map(owner, document)
        fields = dialect_fields(dialect)
        shown: dict[str, str] = {}  # server path -> what the user wrote (the file id)
        for path in fields.data:
            value = _get(document, path)
            field = ".".join(path)
            if isinstance(value, str) and value.startswith("file-"):
                local = self.file_path(owner, value, field)
                shown[local] = value
                if not fields.resolves_file_ids:  # else the parser maps ids itself, through the resolver
                    _set(document, path, local)

        def resolver(value: str) -> str:
            """File ids -> stored paths; other values are server paths, the single local user's only."""
            field = next((".".join(p) for p in fields.data if _get(document, p) == value), "file")
            if not value.startswith("file-") and self.allow_server_paths(owner):
                return value
            try:
                return self.file_path(owner, value, field)
            except ApiError as exc:
                raise LookupError(exc.message.split(": ", 1)[-1]) from None

        check_model_reference(self.store, owner, _get(document, _path(fields.model)), fields.model)
        # a tenant's dataset URLs are read here (their sizes, their rows): connected to checked addresses only
        tenant_calls = OutboundPolicy() if not (is_operator(owner) or self.config.allow_private_urls) else None
        try:
            with applying(tenant_calls):
                spec = parse_document(document, dialect, Path.cwd(), None, resolver)  # type: ignore[arg-type]
        except SpecError as exc:
            raise from_spec_error(exc) from None
        self._check_locations(owner, spec, dialect, shown)
        if not is_operator(owner):
            tenant = tenant_config(self.config, owner, self.store)
            assert tenant is not None
            raise_problems(job_problems(spec, tenant, _user_fields(dialect, document), shown))
        spec = resolve_registered(spec, self.config.mcp_servers)  # after the tenant checks: the operator's servers
        with applying(tenant_calls):
            self._validate_data(spec, dialect, shown)
        return Prepared(spec, document)

    def _check_lambda_map(self, owner: str, document: dict[str, Any]) -> None:
        """A tenant maps Lambda ARNs to URLs only: a handler file would be a server path (and its existence
        would be probed by the resolver)."""
        if self.allow_server_paths(owner):
            return
        mapping = _get(document, ("openrft", "lambda_map"))
        if not isinstance(mapping, dict):
            return
        problems = [
            FieldProblem(f"openrft.lambda_map.{arn}", "names a server file; map the ARN to an http(s) URL", target)
            for arn, target in mapping.items()
            if not (isinstance(target, str) and target.startswith(("http://", "https://")))
        ]
        if problems:
            raise from_spec_error(SpecError(problems))

    def _check_locations(self, owner: str, spec: JobSpec, dialect: str, shown: dict[str, str]) -> None:
        if self.allow_server_paths(owner):
            return
        problems = []
        files_dir = str(self.config.files_dir) + "/"
        fields = dialect_fields(dialect)
        for path, location in zip(fields.data, (spec.data.train, spec.data.validation)):
            if location and location not in shown and not location.startswith(files_dir) and not is_remote(location):
                problems.append(
                    FieldProblem(
                        ".".join(path), "names a server path; upload the file (POST /v1/files) and use its id", location
                    )
                )
        if Path(spec.model.name_or_path).is_absolute():
            problems.append(FieldProblem(fields.model, "is a server path; use a model name", spec.model.name_or_path))
        if problems:
            raise from_spec_error(SpecError(problems))

    def _validate_data(self, spec: JobSpec, dialect: str, shown: dict[str, str]) -> None:
        from openrft.engine.setup import load_datasets  # the engine imports torch: not at server start
        from openrft.rewards import build_reward

        try:
            reward = build_reward(spec.reward)
        except (RewardError, SpecError) as exc:
            if isinstance(exc, SpecError):
                raise from_spec_error(exc) from None
            field = dialect_fields(dialect).reward
            raise ApiError(400, f"{field}: {exc}", "invalid_reward", field) from None
        try:
            load_datasets(spec, reward.requires_reference)
        except DatasetError as exc:
            fields = dialect_fields(dialect)
            field = fields.validation if exc.location == spec.data.validation else fields.train
            raise from_dataset_error(exc, field, shown.get(exc.location)) from None
        except OpenRFTError as exc:
            raise ApiError(400, str(exc), "invalid_job") from None
        finally:
            asyncio.run(reward.aclose())

    def create(self, owner: str, document: dict[str, Any], dialect: str, api: str | None = None) -> Job:
        self.store.check_queue_room(owner, self.max_queued(owner))  # before the (costly) validation
        prepared = self.prepare(owner, document, dialect)
        spec, body = prepared.spec, document
        # on the server's Ray cluster: a job larger than the whole cluster would wait forever
        fields = dialect_fields(dialect)
        refuse_if_never_fits(self.config.ray_address, spec, fields.replicas)
        refuse_if_over_quota(self.store, owner, spec, self.config.ray_address)  # the operator's CPU/GPU-seconds
        job = Job(
            id=new_id("ftjob-"),
            owner=owner,
            api=api or dialect,
            status="queued",
            request=body,
            spec=spec.model_dump(mode="json"),
            model=_get(body, _path(fields.model)) or spec.model.name_or_path,
            display_name=_get(body, _path(fields.display_name)) if fields.display_name else spec.name,
            training_file=_get(body, _path(fields.train)),
            validation_file=_get(body, _path(fields.validation)),
            seed=spec.training.seed,
            suffix=_get(body, _path(fields.suffix)) if fields.suffix else None,
            user_metadata=_get(body, _path(fields.user_metadata)) if fields.user_metadata else None,
            total_steps=spec.training.total_steps,
            priority=spec.runtime.priority,
        )
        return self.store.create_job(
            job, f"Validated {job.training_file or 'the training data'}; job queued", self.max_queued(owner)
        )

    def max_queued(self, owner: str) -> int | None:
        """How many jobs ``owner`` may have waiting to start (None: no cap, the operator)."""
        return None if is_operator(owner) else self.config.max_queued_jobs_per_tenant


def _path(dotted: str) -> tuple[str, ...]:
    return tuple(dotted.split("."))


def _user_fields(dialect: str, document: Any = None) -> dict[str, str]:
    """Spec paths -> where the user wrote them, for the tenant checks' messages."""
    fields = dialect_fields(dialect)
    return {
        **(fields.entry_fields(document) if fields.entry_fields is not None else {}),
        "data.train": fields.train,
        "data.validation": fields.validation,
        "rollout.generator_base_url": "openrft.generator_base_url",
        "rollout.ray_address": "openrft.ray_address",
        "tracking.mlflow_tracking_uri": f"{fields.tracking}.mlflow_tracking_uri",
        "output_dir": fields.output,
        "reward": fields.reward,
    }


def _copy(document: dict[str, Any]) -> dict[str, Any]:
    import copy

    return copy.deepcopy(document)
