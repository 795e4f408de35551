"""Uploaded files: metadata in the database, bytes under a generated name in the files directory."""

from __future__ import annotations

from sqlalchemy import delete, select

from openrft.service.store.base import Repo, new_id, now_s
from openrft.service.store.models import StoredFile


class FilesRepo(Repo):
    def add_file(
        self, owner: str, filename: str, purpose: str, size: int, storage_name: str, file_id: str | None = None
    ) -> StoredFile:
        row = StoredFile(
            id=file_id or new_id("file-"),
            owner=owner,
            filename=filename,
            purpose=purpose,
            bytes=size,
            created_at=now_s(),
            storage_name=storage_name,
        )
        with self.session() as s:
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
