"""The one object the API, the workers and the job processes use to reach the store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from openrft.disk_full import is_disk_full
from openrft.service.store.db import check_reachable, make_engine, migrate
from openrft.service.store.files import FilesRepo
from openrft.service.store.jobs import JobsRepo
from openrft.service.store.keys import KeysRepo
from openrft.service.store.progress import ProgressRepo
from openrft.service.store.reserve import SpaceReserve
from openrft.service.store.samples import SamplesRepo
from openrft.service.store.usage import UsageRepo

T = TypeVar("T")


class Store(KeysRepo, FilesRepo, JobsRepo, ProgressRepo, SamplesRepo, UsageRepo):
    reserve: SpaceReserve | None = None  # room beside an SQLite database file (store/reserve.py)

    @classmethod
    def open(cls, url: str, run_migrations: bool = True) -> Store:
        engine = make_engine(url)
        check_reachable(engine)
        if run_migrations:
            migrate(engine)
        store = cls(engine)
        database = engine.url.database if engine.dialect.name == "sqlite" else None
        if database and database != ":memory:":
            store.reserve = SpaceReserve(Path(database).with_name(Path(database).name + ".reserve"))
            store.reserve.ensure()
        return store

    def with_room(self, write: Callable[[], T]) -> T:
        """``write()``; if it fails on a full disk, once more after freeing the database's reserve: how an
        outcome is recorded on a disk that filled (a job's failure, a dead job process's end)."""
        try:
            return write()
        except Exception as exc:
            if not (is_disk_full(exc) and self.reserve is not None and self.reserve.release()):
                raise
        return write()

    def close(self) -> None:
        self.engine.dispose()
