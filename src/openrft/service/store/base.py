"""What the repositories share: a session factory, clocks and id generation."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker


def now() -> float:
    return time.time()


def now_s() -> int:
    return int(time.time())


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class NotFound(LookupError):
    """No such object for this owner (another tenant's objects are reported the same way)."""


class Conflict(RuntimeError):
    """The object is in a state that does not allow the operation."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class QuotaExceeded(RuntimeError):
    """A tenant's request would pass one of its quotas (``status``: 429 for queued jobs, 413 for bytes)."""

    def __init__(self, message: str, code: str, status: int):
        super().__init__(message)
        self.code = code
        self.status = status


class Repo:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._owner_lock = threading.Lock()  # SQLite: one process writes; PostgreSQL: an advisory lock too

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on error."""
        with self._sessions.begin() as session:
            yield session

    @contextmanager
    def owner_session(self, owner: str) -> Iterator[Session]:
        """A transaction in which no other one checks or changes ``owner``'s quotas: the count a quota reads
        stays true until the row it allows is written (PostgreSQL: across processes, by an advisory lock)."""
        with self._owner_lock, self.session() as session:
            if self.engine.dialect.name == "postgresql":
                session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:owner))"), {"owner": f"quota:{owner}"})
            yield session
