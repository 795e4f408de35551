"""Alembic environment: runs on the connection ``openrft.service.store.db.migrate`` hands over."""

from __future__ import annotations

from alembic import context

from openrft.service.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through openrft.service.store.db.migrate (it passes a connection)")
context.configure(
    connection=connection, target_metadata=Base.metadata, render_as_batch=connection.dialect.name == "sqlite"
)
with context.begin_transaction():
    context.run_migrations()
