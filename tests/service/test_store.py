"""The job store on SQLite and PostgreSQL: migrations, transitions, claims, the reaper, per-step progress."""

from __future__ import annotations

import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from openrft.service.store import CheckpointRecord, Conflict, NotFound, Store
from openrft.service.store.base import QuotaExceeded
from openrft.service.store.models import Base, Job


def make_job(store: Store, owner: str = "alice", status: str = "queued", max_queued: int | None = None) -> Job:
    from openrft.service.store.base import new_id

    job = Job(
        id=new_id("ftjob-"), owner=owner, api="openai", status=status, request={}, spec={}, model="m", total_steps=4
    )
    return store.create_job(job, max_queued=max_queued)


def test_migrations_match_the_models(store):
    with store.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_migrate_twice_is_a_no_op(database_url):
    Store.open(database_url).close()
    Store.open(database_url).close()


def test_owner_isolation_and_pagination(store):
    jobs = [make_job(store) for _ in range(5)]
    make_job(store, owner="bob")
    page, more = store.list_jobs("alice", limit=2)
    assert [j.id for j in page] == [jobs[4].id, jobs[3].id] and more
    page, more = store.list_jobs("alice", limit=2, after=jobs[3].id)
    assert [j.id for j in page] == [jobs[2].id, jobs[1].id] and more
    page, more = store.list_jobs("alice", limit=2, after=jobs[1].id)
    assert [j.id for j in page] == [jobs[0].id] and not more
    with pytest.raises(NotFound):
        store.get_job("bob", jobs[0].id)


def test_claim_takes_the_oldest_once(store):
    first, second = make_job(store), make_job(store)
    assert store.claim_job("w1").id == first.id
    claimed = store.claim_job("w2")
    assert claimed.id == second.id and claimed.status == "running" and claimed.attempts == 1
    assert store.claim_job("w3") is None


def test_concurrent_claims_never_share_a_job(store):
    ids = {make_job(store).id for _ in range(12)}
    claimed: list[str] = []
    lock = threading.Lock()

    def claim_all(worker: str) -> None:
        while (job := store.claim_job(worker)) is not None:
            with lock:
                claimed.append(job.id)

    threads = [threading.Thread(target=claim_all, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(ids)


def test_cancel_pause_resume_transitions(store):
    queued = make_job(store)
    assert store.request_pause("alice", queued.id).status == "paused"
    assert store.request_resume("alice", queued.id).status == "queued"
    assert store.request_cancel("alice", queued.id).status == "cancelled"
    with pytest.raises(Conflict):
        store.request_cancel("alice", queued.id)
    with pytest.raises(Conflict):
        store.request_resume("alice", queued.id)

    running = make_job(store)
    store.claim_job("w1")
    job = store.request_pause("alice", running.id)
    assert (job.status, job.control) == ("pausing", "pause")
    with pytest.raises(Conflict):
        store.request_resume("alice", running.id)  # still pausing
    job = store.request_cancel("alice", running.id)
    assert (job.status, job.control) == ("pausing", "cancel")
    assert store.finish(running.id, 1, "cancelled", "stopped")
    assert store.get_job("alice", running.id).status == "cancelled"


def test_finish_is_fenced_by_attempt(store):
    job = make_job(store)
    store.claim_job("w1")
    assert not store.finish(job.id, 2, "succeeded", "a stale process")
    assert store.finish(job.id, 1, "succeeded", "done")


def test_reaper_requeues_cancels_and_gives_up(store):
    plain, cancelled, paused = make_job(store), make_job(store), make_job(store)
    for _ in range(3):
        store.claim_job("dead")
    store.request_cancel("alice", cancelled.id)
    store.request_pause("alice", paused.id)
    assert store.reap_expired(timeout_s=60, max_attempts=3) == []  # heartbeats are fresh
    assert sorted(store.reap_expired(timeout_s=-1, max_attempts=3)) == sorted([plain.id, cancelled.id, paused.id])
    assert store.get_job(None, plain.id).status == "queued"
    assert store.get_job(None, cancelled.id).status == "cancelled"
    assert store.get_job(None, paused.id).status == "paused"
    again = store.claim_job("w2")
    assert again.id == plain.id and again.attempts == 2
    store.reap_expired(timeout_s=-1, max_attempts=2)
    failed = store.get_job(None, plain.id)
    assert failed.status == "failed" and failed.error_code == "worker_lost"


def test_a_gone_worker_s_jobs_are_requeued_once_silent_and_only_that_worker_s(store):
    """A host's workers are found by prefix (a ``_`` in the host name is no wildcard); the jobs of one known gone
    go back to the queue only once they have been silent for ``silent_s``, the others' jobs stay theirs."""
    gone, alive, elsewhere = make_job(store), make_job(store), make_job(store)
    store.claim_job("host_a:101:x", gone.id)
    store.claim_job("host_a:102:y", alive.id)
    store.claim_job("hostXa:103:z", elsewhere.id)
    assert store.workers_holding_jobs("host_a:") == {"host_a:101:x", "host_a:102:y"}
    assert store.reap_worker("host_a:101:x", "ended", 3, silent_s=60) == []  # it beat just now
    assert store.reap_worker("host_a:101:x", "ended", 3, silent_s=-1) == [gone.id]
    assert [store.get_job(None, j.id).status for j in (gone, alive, elsewhere)] == ["queued", "running", "running"]
    messages = [e.message for e in store.list_events(gone.id, limit=10)[0]]
    assert "worker host_a:101:x ended; requeued to resume from the last checkpoint" in messages


def test_steps_are_recorded_once_and_truncated_on_resume(store):
    job = make_job(store)
    for step in range(4):
        store.record_step(job.id, step, {"critic/rewards/mean": step / 10}, {"step": step}, f"step {step}")
    store.record_step(job.id, 2, {"critic/rewards/mean": 0.9}, {"step": 2}, "step 2 again")
    rows = store.metrics(job.id)
    assert [r.step for r in rows] == [0, 1, 2, 3]
    assert rows[2].data == {"critic/rewards/mean": 0.9}
    metric_events = [e for e in store.list_events(job.id, limit=100)[0] if e.type == "metrics"]
    assert sorted(e.step for e in metric_events) == [0, 1, 2, 3]
    store.truncate_after(job.id, 1)
    assert [r.step for r in store.metrics(job.id)] == [0, 1]
    assert sorted(e.step for e in store.list_events(job.id, limit=100)[0] if e.type == "metrics") == [0, 1]
    assert store.get_job(None, job.id).last_step == 1


def test_events_page_backwards_with_after(store):
    job = make_job(store)  # two events at creation
    for i in range(5):
        store.add_event(job.id, "info", f"e{i}")
    first, more = store.list_events(job.id, limit=3)
    assert [e.message for e in first] == ["e4", "e3", "e2"] and more
    second, more = store.list_events(job.id, after=first[-1].seq, limit=3)
    assert [e.message for e in second][:2] == ["e1", "e0"] and more
    assert [e.message for e in store.events_since(job.id, first[0].seq - 2)] == ["e3", "e4"]


def test_best_checkpoints_by_validation_reward(store):
    job = make_job(store)
    rewards = {1: 0.2, 2: None, 3: 0.7, 4: 0.5, 5: 0.7}
    store.sync_checkpoints(job.id, [CheckpointRecord(s, f"/c/{s}", r, {"step": s}) for s, r in rewards.items()])
    assert [c.step for c in store.best_checkpoints(job.id)] == [5, 3, 4]
    store.sync_checkpoints(job.id, [CheckpointRecord(s, f"/c/{s}", rewards[s], {}) for s in (2, 4)])
    assert [c.step for c in store.best_checkpoints(job.id)] == [4, 2]


def test_keys_hash_and_revoke(store):
    assert not store.any_keys()
    key, secret = store.create_key("ci")
    assert store.any_keys() and store.owner_for_key(secret) == key.id
    assert secret not in {k.key_hash for k in store.list_keys()}
    assert store.owner_for_key(secret + "x") is None
    assert store.revoke_key(key.id) and store.owner_for_key(secret) is None and not store.any_keys()


def test_claims_take_turns_across_tenants(store):
    """One tenant's queued backlog does not keep another's job queued: claims go round-robin."""
    greedy = [make_job(store, owner="greedy") for _ in range(30)]
    polite, late = make_job(store, owner="polite"), make_job(store, owner="late")
    order = [store.claim_job("w").id for _ in range(5)]
    assert order[:3] == [greedy[0].id, polite.id, late.id]  # each tenant's oldest, tenants in first-seen order
    assert order[3:] == [greedy[1].id, greedy[2].id]  # the others have nothing queued
    second_polite = make_job(store, owner="polite")
    assert store.claim_job("w").id == second_polite.id  # polite's last claim is older than greedy's
    assert store.claim_job("w").id == greedy[3].id


def test_queued_jobs_are_capped_per_tenant(store):
    for _ in range(3):
        make_job(store, "alice", max_queued=3)
    with pytest.raises(QuotaExceeded) as caught:
        make_job(store, "alice", max_queued=3)
    assert caught.value.status == 429 and "limit of 3 queued jobs" in str(caught.value)
    make_job(store, "bob", max_queued=3)  # another tenant's room is its own
    store.claim_job("w")  # one of alice's starts: room for one more
    paused = store.request_pause("alice", make_job(store, "alice", max_queued=3).id)
    make_job(store, "alice", max_queued=3)
    with pytest.raises(QuotaExceeded):
        store.request_resume("alice", paused.id, max_queued=3)  # a resumed job counts as queued again
    assert store.get_job("alice", paused.id).status == "paused"


def test_stored_bytes_are_capped_per_tenant(store):
    store.add_file("alice", "a.jsonl", "fine-tune", 600, "s1", max_bytes=1000)
    with pytest.raises(QuotaExceeded) as caught:
        store.add_file("alice", "b.jsonl", "fine-tune", 401, "s2", max_bytes=1000)
    assert caught.value.status == 413 and "limit of 1,000 bytes" in str(caught.value)
    store.add_file("alice", "b.jsonl", "fine-tune", 400, "s2", max_bytes=1000)
    store.add_file("bob", "c.jsonl", "fine-tune", 1000, "s3", max_bytes=1000)
    assert store.stored_bytes("alice") == 1000 and store.stored_bytes("carol") == 0
