"""Fixtures for the job service: real server and worker processes on 127.0.0.1, SQLite and PostgreSQL.

PostgreSQL tests read ``OPENRFT_TEST_POSTGRES_URL`` (``.ci/run`` starts a server and sets it). Unset,
they are skipped; set but unreachable, they fail. Each test gets a database of its own.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from openrft.service.store import Store
from tests.service.svc_helpers import Service

POSTGRES_ENV = "OPENRFT_TEST_POSTGRES_URL"


def _postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"{POSTGRES_ENV} is not set (CI sets it; see .ci/postgres.sh)")
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty database of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'openrft.db'}"
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from openrft.service.store.db import normalise_url

    admin_url = normalise_url(_postgres_admin_url())
    name = f"openrft_t_{secrets.token_hex(6)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:  # unreachable with the variable set: the test fails here, never skips
            c.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        try:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        finally:
            admin.dispose()


@pytest.fixture
def store(database_url) -> Iterator[Store]:
    s = Store.open(database_url)
    yield s
    s.close()


@pytest.fixture
def service(tmp_path, database_url) -> Iterator[Service]:
    svc = Service(tmp_path / "data", database_url)
    yield svc
    svc.stop_all()
