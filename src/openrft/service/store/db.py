"""Database engines (SQLite by default, PostgreSQL by URL) and running the packaged migrations."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from openrft.errors import OpenRFTError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_PG_MIGRATION_LOCK = 7_240_911  # pg_advisory_lock key: one migrating process at a time


def normalise_url(url: str) -> str:
    """``postgresql://`` -> ``postgresql+psycopg://`` (psycopg 3 is the driver OpenRFT installs)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str) -> Engine:
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the one writer
            cursor.execute("PRAGMA busy_timeout=60000")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    if parsed.get_backend_name() != "postgresql":
        shown = parsed.render_as_string()
        raise OpenRFTError(f"database URL {shown!r}: only sqlite:/// and postgresql:// URLs are supported")
    try:
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    except ModuleNotFoundError as exc:
        raise OpenRFTError(f"PostgreSQL needs the psycopg driver: pip install 'openrft[postgres]' ({exc})") from None


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (idempotent; several processes may call it at once)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")


def check_reachable(engine: Engine) -> None:
    """Fail with a readable message when the database cannot be reached."""
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:  # the driver's own exception types differ per backend
        url = engine.url.render_as_string(hide_password=True)
        raise OpenRFTError(f"cannot reach the database {url}: {exc.__class__.__name__}: {exc}") from None
