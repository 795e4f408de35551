"""``/v1/files``: upload (purpose fine-tune), list, get, content, delete. Bytes live under generated names."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse

from openrft.service.auth import current_owner
from openrft.service.errors import ApiError
from openrft.service.schemas import FileDeleted, FileObject, Page
from openrft.service.store.base import new_id
from openrft.service.store.files import quota_message
from openrft.service.tenancy import is_operator
from openrft.service.views import openai_file

router = APIRouter(prefix="/v1/files", tags=["files"])
Owner = Annotated[str, Depends(current_owner)]
PURPOSES = ("fine-tune",)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\]")


def clean_filename(name: str | None) -> str:
    """Only for display: the last path part, no control characters, at most 255 characters."""
    base = Path((name or "upload.jsonl").replace("\\", "/")).name
    return _UNSAFE.sub("_", base)[:255] or "upload.jsonl"


def check_jsonl(path: Path) -> None:
    """Fine-tune files are UTF-8 JSON Lines with at least one record; the job's dialect checks each
    record's fields later."""
    records = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ApiError(
                    400, f"file: line {number} is not valid UTF-8 JSON: {exc}", "invalid_file_format", "file"
                ) from None
            except RecursionError:
                raise ApiError(
                    400, f"file: line {number} nests too deeply to be read", "invalid_file_format", "file"
                ) from None
            records += 1
    if records == 0:
        raise ApiError(400, "file: holds no JSON lines (it is empty or only whitespace)", "invalid_file_format", "file")


class _PastQuota(Exception):
    pass


def _copy_at_most(source, out, max_bytes: int | None) -> None:
    copied = 0
    while chunk := source.read(1 << 20):
        copied += len(chunk)
        if max_bytes is not None and copied > max_bytes:
            raise _PastQuota
        out.write(chunk)


def _store_upload(source, target: Path, max_bytes: int | None = None) -> None:
    """Copy the upload to ``target`` through a temporary name, so that no partial file is ever left under the
    files directory; a full disk is a 507 that says so. Past ``max_bytes`` (the tenant's room left), _PastQuota."""
    partial = target.with_name(f".{target.name}.partial")
    try:
        with partial.open("wb") as out:
            _copy_at_most(source, out, max_bytes)
        partial.rename(target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ApiError(
                507, "the server has no space left to store this file; try again later", "insufficient_storage"
            ) from None
        raise
    finally:
        partial.unlink(missing_ok=True)


@router.post("", response_model=FileObject)
def upload_file(
    request: Request, owner: Owner, file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()]
) -> FileObject:
    if purpose not in PURPOSES:
        raise ApiError(
            400,
            f"purpose: {purpose!r} is not supported; use one of {', '.join(PURPOSES)}",
            "invalid_purpose",
            "purpose",
        )
    store, config = request.app.state.store, request.app.state.config
    cap = None if is_operator(owner) else config.max_stored_bytes_per_tenant
    tinker = getattr(request.app.state, "tinker", None)  # the key's Tinker checkpoints count in its quota too
    held = tinker.checkpoints.owner_bytes(owner) if tinker is not None and cap is not None else 0
    used = store.stored_bytes(owner) + held if cap is not None else 0
    if cap is not None and used >= cap:
        raise ApiError(413, quota_message(used, None, cap), "storage_quota_exceeded", "file")
    file_id = new_id("file-")
    target = config.files_dir / file_id
    try:
        _store_upload(file.file, target, None if cap is None else cap - used)
    except _PastQuota:
        size = file.size if file.size is not None else cap - used + 1
        raise ApiError(413, quota_message(used, size, cap), "storage_quota_exceeded", "file") from None
    try:
        check_jsonl(target)
        size = target.stat().st_size
        room = None if cap is None else cap - held
        row = store.add_file(owner, clean_filename(file.filename), purpose, size, file_id, file_id, max_bytes=room)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return openai_file(row)


@router.get("", response_model=Page[FileObject])
def list_files(
    request: Request,
    owner: Owner,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    after: str | None = None,
) -> Page[FileObject]:
    rows, more = request.app.state.store.list_files(owner, purpose, limit, after)
    data = [openai_file(r) for r in rows]
    return Page[FileObject](
        data=data, has_more=more, first_id=data[0].id if data else None, last_id=data[-1].id if data else None
    )


def _row(request: Request, owner: str, file_id: str):
    row = request.app.state.store.get_file(owner, file_id)
    if row is None:
        raise ApiError(404, f"No such File object: {file_id}", "file_not_found", "file_id")
    return row


@router.get("/{file_id}", response_model=FileObject)
def get_file(request: Request, owner: Owner, file_id: str) -> FileObject:
    return openai_file(_row(request, owner, file_id))


@router.get("/{file_id}/content", response_class=FileResponse)
def file_content(request: Request, owner: Owner, file_id: str) -> FileResponse:
    row = _row(request, owner, file_id)
    return FileResponse(
        request.app.state.config.files_dir / row.storage_name,
        media_type="application/octet-stream",
        filename=row.filename,
    )


@router.delete("/{file_id}", response_model=FileDeleted)
def delete_file(request: Request, owner: Owner, file_id: str) -> FileDeleted:
    row = request.app.state.store.delete_file(owner, file_id)
    if row is None:
        raise ApiError(404, f"No such File object: {file_id}", "file_not_found", "file_id")
    (request.app.state.config.files_dir / row.storage_name).unlink(missing_ok=True)
    return FileDeleted(id=file_id, deleted=True)
