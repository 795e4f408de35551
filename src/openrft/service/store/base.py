"""What the repositories share: a session factory, clocks and id generation."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine
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


class Repo:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on error."""
        with self._sessions.begin() as session:
            yield session
