"""The one object the API, the workers and the job processes use to reach the store."""

from __future__ import annotations

from openrft.service.store.db import check_reachable, make_engine, migrate
from openrft.service.store.files import FilesRepo
from openrft.service.store.jobs import JobsRepo
from openrft.service.store.keys import KeysRepo
from openrft.service.store.progress import ProgressRepo
from openrft.service.store.samples import SamplesRepo


class Store(KeysRepo, FilesRepo, JobsRepo, ProgressRepo, SamplesRepo):
    @classmethod
    def open(cls, url: str, run_migrations: bool = True) -> Store:
        engine = make_engine(url)
        check_reachable(engine)
        if run_migrations:
            migrate(engine)
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()
