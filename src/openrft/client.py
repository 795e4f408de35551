"""The typed Python SDK of the OpenRFT job service.

from openrft import Client
client = Client("http://127.0.0.1:8000")            # api_key from OPENRFT_API_KEY if set
job = client.create_job("examples/arithmetic/recipe.yaml")   # any dialect; local data is uploaded
for event in client.follow_events(job.id):
    print(event.message)
print(client.get_job(job.id).status, client.list_checkpoints(job.id))
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from openrft.errors import OpenRFTError
from openrft.service.dialect_fields import get_field, set_field
from openrft.service.schemas import FileDeleted, FileObject, FineTuningJob, JobCheckpoint, JobEvent, Page, TuningJob
from openrft.spec.dialects import registry

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
TERMINAL = ("succeeded", "failed", "cancelled")


class ServiceError(OpenRFTError):
    """An error answer from the service: HTTP status, error code, message, the field it names."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        problems: list[dict[str, Any]] | None = None,
    ):
        super().__init__(f"{status} {code or 'error'}: {message}")
        self.status = status
        self.code = code
        self.param = param
        self.problems = problems or []


class Client:
    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0):
        self.base_url = (base_url or os.environ.get("OPENRFT_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get("OPENRFT_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(0, f"cannot reach {self.base_url}: {exc}", "connection_error") from None
        if response.status_code >= 400:
            try:
                error = response.json().get("error", {})
            except ValueError:
                error = {"message": response.text}
            raise ServiceError(
                response.status_code,
                error.get("message", response.reason_phrase),
                error.get("code") or error.get("status"),
                error.get("param"),
                error.get("problems"),
            )
        return response.json()

    # files ---------------------------------------------------------------------------------------------

    def upload_file(self, path: str | Path, purpose: str = "fine-tune") -> FileObject:
        path = Path(path)
        with path.open("rb") as f:
            data = self._request("POST", "/v1/files", files={"file": (path.name, f)}, data={"purpose": purpose})
        return FileObject.model_validate(data)

    def list_files(self, purpose: str | None = None) -> list[FileObject]:
        params = {"purpose": purpose} if purpose else {}
        return Page[FileObject].model_validate(self._request("GET", "/v1/files", params=params)).data

    def get_file(self, file_id: str) -> FileObject:
        return FileObject.model_validate(self._request("GET", f"/v1/files/{file_id}"))

    def delete_file(self, file_id: str) -> FileDeleted:
        return FileDeleted.model_validate(self._request("DELETE", f"/v1/files/{file_id}"))

    # jobs ----------------------------------------------------------------------------------------------

    def create_job(
        self,
        job: str | Path | dict[str, Any],
        dialect: str | None = None,
        upload: bool = True,
        project: str = "openrft",
        location: str = "local",
    ) -> FineTuningJob:
        """Submit a job in any dialect (a file path or a parsed document). Dataset fields that name local
        files are uploaded first and replaced by their file ids."""
        from openrft.spec.dialects import detect_dialect, read_document

        base_dir = Path.cwd()
        if isinstance(job, str | Path):
            base_dir = Path(job).resolve().parent
            job = read_document(Path(job))
        document = json.loads(json.dumps(job))
        dialect = dialect or detect_dialect(document)
        if dialect not in registry.service_dialects():
            raise OpenRFTError(
                f"the service takes {', '.join(registry.service_dialects())} jobs, not {dialect!r} documents"
            )
        if upload:
            self._upload_datasets(document, dialect, base_dir)
        if dialect == "openai":
            return FineTuningJob.model_validate(self._request("POST", "/v1/fine_tuning/jobs", json=document))
        if dialect == "nova":
            return FineTuningJob.model_validate(self._request("POST", "/v1/nova/jobs", json=document))
        created = self.create_tuning_job(document, project, location)
        return self.get_job(created.name.rsplit("/", 1)[-1])

    def _upload_datasets(self, document: dict[str, Any], dialect: str, base_dir: Path) -> None:
        for path in registry.fields(dialect).data:
            value = get_field(document, path)
            if not isinstance(value, str) or value.startswith("file-") or "://" in value:
                continue
            local = Path(value).expanduser()
            local = local if local.is_absolute() else base_dir / local
            if local.is_file():
                set_field(document, path, self.upload_file(local).id)

    def list_jobs(self, limit: int = 20, after: str | None = None) -> Page[FineTuningJob]:
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        return Page[FineTuningJob].model_validate(self._request("GET", "/v1/fine_tuning/jobs", params=params))

    def iter_jobs(self, page_size: int = 100) -> Iterator[FineTuningJob]:
        after = None
        while True:
            page = self.list_jobs(page_size, after)
            yield from page.data
            if not page.has_more or not page.data:
                return
            after = page.data[-1].id

    def get_job(self, job_id: str) -> FineTuningJob:
        return FineTuningJob.model_validate(self._request("GET", f"/v1/fine_tuning/jobs/{job_id}"))

    def cancel_job(self, job_id: str) -> FineTuningJob:
        return FineTuningJob.model_validate(self._request("POST", f"/v1/fine_tuning/jobs/{job_id}/cancel"))

    def pause_job(self, job_id: str) -> FineTuningJob:
        return FineTuningJob.model_validate(self._request("POST", f"/v1/fine_tuning/jobs/{job_id}/pause"))

    def resume_job(self, job_id: str) -> FineTuningJob:
        return FineTuningJob.model_validate(self._request("POST", f"/v1/fine_tuning/jobs/{job_id}/resume"))

    def wait(
        self,
        job_id: str,
        statuses: tuple[str, ...] = TERMINAL,
        timeout: float | None = None,
        poll_interval: float = 1.0,
    ) -> FineTuningJob:
        """Poll until the job reaches one of ``statuses``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.status in statuses:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout}s")
            time.sleep(poll_interval)

    # events, checkpoints, metrics ----------------------------------------------------------------------------

    def list_events(self, job_id: str, after: str | None = None, limit: int = 20) -> Page[JobEvent]:
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        data = self._request("GET", f"/v1/fine_tuning/jobs/{job_id}/events", params=params)
        return Page[JobEvent].model_validate(data)

    def new_events(self, job_id: str, since: int = 0) -> list[JobEvent]:
        """Events with a sequence number above ``since``, oldest first."""
        found: list[JobEvent] = []
        after = None
        while True:
            page = self.list_events(job_id, after, 100)
            fresh = [e for e in page.data if _seq(e) > since]
            found.extend(fresh)
            if not page.has_more or len(fresh) < len(page.data) or not page.data:
                return sorted(found, key=_seq)
            after = page.data[-1].id

    def follow_events(self, job_id: str, poll_interval: float = 1.0, until_done: bool = True) -> Iterator[JobEvent]:
        """Every event of the job, oldest first, as it happens; ends once the job is finished (or paused)."""
        since = 0
        while True:
            status = self.get_job(job_id).status
            for event in self.new_events(job_id, since):
                since = _seq(event)
                yield event
            if until_done and status in (*TERMINAL, "paused"):
                return
            time.sleep(poll_interval)

    def list_checkpoints(self, job_id: str) -> list[JobCheckpoint]:
        """The best three checkpoints by validation reward, best first."""
        data = self._request("GET", f"/v1/fine_tuning/jobs/{job_id}/checkpoints")
        return Page[JobCheckpoint].model_validate(data).data

    def metrics(self, job_id: str) -> list[dict[str, Any]]:
        """Every recorded step's metrics, oldest first."""
        return self._request("GET", f"/v1/fine_tuning/jobs/{job_id}/metrics")["data"]

    def list_samples(self, job_id: str, offset: int = 0, limit: int = 50, **filters: Any) -> Page[dict[str, Any]]:
        """One page of the job's recorded samples; ``filters``: kind, step, example_id, error_kind, grader,
        min_reward, max_reward, order (the route's query parameters)."""
        params = {k: v for k, v in filters.items() if v is not None}
        data = self._request(
            "GET", f"/v1/fine_tuning/jobs/{job_id}/samples", params={**params, "offset": offset, "limit": limit}
        )
        return Page[dict[str, Any]].model_validate(data)

    def iter_samples(self, job_id: str, page_size: int = 200, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every recorded sample of the job that matches ``filters``, page by page."""
        offset = 0
        while True:
            page = self.list_samples(job_id, offset, page_size, **filters)
            yield from page.data
            if not page.has_more:
                return
            offset += len(page.data)

    # graders and Vertex ------------------------------------------------------------------------------------

    def run_grader(self, grader: dict[str, Any], model_sample: str, item: Any = None) -> dict[str, Any]:
        return self._request(
            "POST",
            "/v1/fine_tuning/alpha/graders/run",
            json={"grader": grader, "model_sample": model_sample, "item": item},
        )

    def validate_grader(self, grader: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", "/v1/fine_tuning/alpha/graders/validate", json={"grader": grader})

    def create_tuning_job(self, body: dict[str, Any], project: str = "openrft", location: str = "local") -> TuningJob:
        data = self._request("POST", f"/v1/projects/{project}/locations/{location}/tuningJobs", json=body)
        return TuningJob.model_validate(data)

    def get_tuning_job(self, job_id: str, project: str = "openrft", location: str = "local") -> TuningJob:
        data = self._request("GET", f"/v1/projects/{project}/locations/{location}/tuningJobs/{job_id}")
        return TuningJob.model_validate(data)


def _seq(event: JobEvent) -> int:
    return int(event.id.removeprefix("ftevent-"))
