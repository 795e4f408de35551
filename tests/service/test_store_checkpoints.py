"""Checkpoint rows on SQLite and PostgreSQL: any number per (job, step), as a Tinker training client saves
its state and its sampler weights at one step (the tinker-cookbook's ``save_state("final")`` and
``save_weights_for_sampler("final")``); migration 0004 lifts the old one-per-step constraint without
losing rows, and its downgrade keeps the newest row of each step."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import select, text

from openrft.service.store import CheckpointRecord, Store
from openrft.service.store.db import MIGRATIONS, make_engine, migrate
from openrft.service.store.models import Checkpoint
from openrft.service.tinker.records import SessionRecords
from tests.service.test_store import make_job


def rows(store: Store, job_id: str) -> list[tuple[int, str]]:
    with store.session() as s:
        found = s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.path))
        return [(c.step, c.path) for c in found]


def test_a_tinker_client_saves_any_number_of_checkpoints_at_one_step(store):
    records = SessionRecords(store)
    job_id = records.started("alice", "sess_1:train:0", "openrft-demo", {"rank": 4})
    paths = [f"tinker://sess_1:train:0/{kind}/{name}" for kind in ("weights", "sampler_weights") for name in "ab"]
    for path in paths:
        records.checkpoint(job_id, 3, path, "state")
    records.checkpoint(job_id, 3, paths[0], "state")  # saved again under its name (overwrite): still one row
    assert rows(store, job_id) == sorted((3, p) for p in paths)


def test_a_jobs_checkpoints_stay_one_per_step(store):
    job = make_job(store)
    store.sync_checkpoints(job.id, [CheckpointRecord(step=2, path="/r/2", val_reward=0.5, metrics={})])
    store.sync_checkpoints(job.id, [CheckpointRecord(step=2, path="/r/2b", val_reward=0.6, metrics={})])
    assert rows(store, job.id) == [(2, "/r/2b")]


def _alembic(engine, action, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        action(cfg, revision)


def _insert(engine, checkpoint_id: str, step: int, created_at: int) -> None:
    with engine.begin() as c:
        c.execute(
            text("INSERT INTO checkpoints (id, job_id, step, created_at, path) VALUES (:id, 'job', :step, :at, :path)"),
            {"id": checkpoint_id, "step": step, "at": created_at, "path": f"/runs/{checkpoint_id}"},
        )


def test_migration_0004_lifts_the_constraint_and_keeps_the_rows(database_url):
    engine = make_engine(database_url)
    try:
        _alembic(engine, command.upgrade, "0003")
        _insert(engine, "old", 1, 10)
        migrate(engine)
        _insert(engine, "new", 1, 20)  # the same step: refused (IntegrityError) before 0004
        _insert(engine, "other", 2, 30)
        with engine.connect() as c:
            assert sorted(c.execute(text("SELECT id FROM checkpoints")).scalars()) == ["new", "old", "other"]
        _alembic(engine, command.downgrade, "0003")
        with engine.connect() as c:
            assert sorted(c.execute(text("SELECT id FROM checkpoints")).scalars()) == ["new", "other"]
        migrate(engine)
    finally:
        engine.dispose()
