"""Uploaded files: metadata in the database, bytes under a generated name in the files directory."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from openrft.service.store.base import QuotaExceeded, Repo, new_id, now_s
from openrft.service.store.models import StoredFile


def quota_message(used: int, size: int | None, max_bytes: int) -> str:
    adding = f"; this file's {size:,} bytes would pass" if size is not None else ", all of"
    return (
        f"this API key stores {used:,} bytes in files{adding} the service's limit of {max_bytes:,} bytes stored "
        "per API key; delete files (DELETE /v1/files/ID) to make room"
    )


def _owner_bytes(s: Session, owner: str) -> int:
    return int(s.scalar(select(func.coalesce(func.sum(StoredFile.bytes), 0)).where(StoredFile.owner == owner)))


class FilesRepo(Repo):
    def stored_bytes(self, owner: str) -> int:
        """The bytes of ``owner``'s files (uploads and jobs' result files)."""
        with self.session() as s:
            return _owner_bytes(s, owner)

    def add_file(
        self,
        owner: str,
        filename: str,
        purpose: str,
        size: int,
        storage_name: str,
        file_id: str | None = None,
        max_bytes: int | None = None,
    ) -> StoredFile:
        """Record a stored file; with ``max_bytes``, refused (QuotaExceeded, 413) when it would take its owner's
        files past that many bytes."""
        row = StoredFile(
            id=file_id or new_id("file-"),
            owner=owner,
            filename=filename,
            purpose=purpose,
            bytes=size,
            created_at=now_s(),
            storage_name=storage_name,
        )
        with self.owner_session(owner) as s:
            if max_bytes is not None:
                used = _owner_bytes(s, owner)
                if used + size > max_bytes:
                    raise QuotaExceeded(quota_message(used, size, max_bytes), "storage_quota_exceeded", 413)
            s.add(row)
        return row

    def get_file(self, owner: str, file_id: str) -> StoredFile | None:
        with self.session() as s:
            return s.scalar(select(StoredFile).where(StoredFile.id == file_id, StoredFile.owner == owner))

    def list_files(
        self, owner: str, purpose: str | None = None, limit: int = 100, after: str | None = None
    ) -> tuple[list[StoredFile], bool]:
        with self.session() as s:
            query = select(StoredFile).where(StoredFile.owner == owner)
            if purpose:
                query = query.where(StoredFile.purpose == purpose)
            if after:
                cursor = s.scalar(select(StoredFile.seq).where(StoredFile.id == after, StoredFile.owner == owner))
                if cursor is not None:
                    query = query.where(StoredFile.seq < cursor)
            rows = list(s.scalars(query.order_by(StoredFile.seq.desc()).limit(limit + 1)))
        return rows[:limit], len(rows) > limit

    def delete_file(self, owner: str, file_id: str) -> StoredFile | None:
        with self.session() as s:
            row = s.scalar(select(StoredFile).where(StoredFile.id == file_id, StoredFile.owner == owner))
            if row is not None:
                s.execute(delete(StoredFile).where(StoredFile.seq == row.seq))
            return row
