"""Tenants' quotas of CPU- and GPU-seconds and priorities within a tenant, in the store and the worker (a real
SQLite or PostgreSQL store; the job processes are stand-ins that never end). tests/service/test_cluster_quotas.py
runs the same through a real server on a local Ray cluster with the official openai client."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from openrft.models import machine_cpus
from openrft.service.errors import ApiError
from openrft.service.quotas import Reserved, refuse_if_over_quota, reserved
from openrft.service.store.models import JobUsage
from tests.service.test_admission import Launcher, _queued, _spec


def _worker(store, tmp_path, concurrency=1):
    from openrft.service.config import ServiceConfig
    from openrft.service.worker import Worker

    config = ServiceConfig.build(tmp_path, store.engine.url.render_as_string(hide_password=False))
    return Worker(store, config, concurrency=concurrency, launcher=Launcher())


def _ran(store, owner: str, seconds: float, cpu: float = 1.0, gpu: float = 0.0, job_id: str | None = None) -> None:
    """A finished attempt of ``owner``'s that held ``cpu`` CPUs and ``gpu`` GPUs for ``seconds``."""
    job_id = job_id or f"ftjob-done-{owner}-{seconds}"
    store.start_usage(job_id, 1, owner, cpu, gpu)
    with store.session() as s:
        s.execute(update(JobUsage).where(JobUsage.job_id == job_id).values(started_at=JobUsage.last_seen - seconds))


def test_use_is_what_each_attempt_reserved_times_how_long_it_ran(store):
    _ran(store, "alice", 10, cpu=2)
    _ran(store, "alice", 5, cpu=1, gpu=1)
    _ran(store, "bob", 7)
    used = store.used("alice")
    assert (round(used.cpu_seconds), round(used.gpu_seconds)) == (25, 5)
    assert round(store.used("bob").cpu_seconds) == 7
    assert store.quota_for("alice") is None  # no quota: no limit
    store.set_quota("*", 100, None)
    store.set_quota("alice", 20, 0)
    assert store.quota_for("bob").owner == "*" and store.quota_for("alice").cpu_seconds == 20
    store.set_quota("alice", 20, 0, reset=True)  # counted from now on
    assert store.used("alice", store.quota_for("alice").since).cpu_seconds < 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_tenant_over_its_quota_waits_saying_which_and_the_others_go_ahead(store, tmp_path):
    worker = _worker(store, tmp_path, concurrency=3)
    spec = _spec().model_dump(mode="json")
    store.set_quota("alice", 3600, None)
    _ran(store, "alice", 3600)  # one CPU for an hour: all of alice's quota
    alice, bob = _queued(store, spec, owner="alice"), _queued(store, spec, owner="bob")
    worker.tick()
    assert [job_id for job_id, _ in worker.launcher.started] == [bob.id]
    waiting = store.get_job(None, alice.id)
    assert waiting.status == "queued"
    assert waiting.queue_reason == "tenant quota: 3600 CPU-seconds used of 3600"
    events = [e.message for e in store.list_events(alice.id, limit=20)[0]]
    assert "Queued: tenant quota: 3600 CPU-seconds used of 3600" in events

    # at submission: a job of alice's is refused by name (429, OpenAI's insufficient_quota); bob's is not
    with pytest.raises(ApiError) as refused:
        refuse_if_over_quota(store, "alice", _spec(), None)
    assert (refused.value.status, refused.value.code) == (429, "insufficient_quota")
    assert refused.value.message.startswith("tenant quota: 3600 CPU-seconds used of 3600")
    refuse_if_over_quota(store, "bob", _spec(), None)
    refuse_if_over_quota(store, "local", _spec(), None)  # the operator has none

    store.set_quota("alice", 7200, None)  # the operator raises it: alice's job starts at the next turn
    worker.tick()
    assert [job_id for job_id, _ in worker.launcher.started] == [bob.id, alice.id]
    assert store.get_job(None, alice.id).queue_reason is None
    # what it reserved counts while it runs: its attempt's row, seen at each heartbeat
    assert store.reserved_now([alice.id]) == {alice.id: (1.0, 0.0)}


def test_a_local_job_reserves_its_threads_and_with_threads_unset_every_core_as_it_uses_them():
    assert reserved(_spec(threads=3), None, None) == Reserved(3.0, 0.0)
    assert reserved(_spec(threads=None), None, None) == Reserved(float(machine_cpus()[0]), 0.0)
    assert reserved(_spec(threads=None), {"CPU": 4.0, "GPU": 1.0}, None) == Reserved(4.0, 1.0)  # its group's


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_gpu_seconds_quota_holds_back_only_jobs_that_take_gpus(store, tmp_path):
    store.set_quota("alice", None, 0)
    with pytest.raises(ApiError) as refused:
        refuse_if_over_quota(store, "alice", _spec(device="cuda"), None)
    assert "0 GPU-seconds" in refused.value.message
    refuse_if_over_quota(store, "alice", _spec(device="cpu"), None)
    worker = _worker(store, tmp_path)
    cpu_job = _queued(store, _spec(device="cpu").model_dump(mode="json"), owner="alice")
    worker.tick()
    assert [job_id for job_id, _ in worker.launcher.started] == [cpu_job.id]


def test_priorities_order_a_tenants_own_jobs_never_ahead_of_another_tenants_turn(store, tmp_path):
    """alice queues two jobs, then one of priority 5; bob then queues one of priority 100. alice was first to
    queue, so her turn comes first, and she uses it for her priority-5 job; then it is bob's turn (his priority
    does not jump alice's turn, nor does it matter against her jobs); then alice's older jobs in order. The worker
    (queued_heads) and the store's claim (claim_job) agree."""
    spec = _spec().model_dump(mode="json")

    def queue(owner: str, priority: int = 0):
        from openrft.service.store.base import new_id
        from openrft.service.store.models import Job

        job = Job(id=new_id("ftjob-"), owner=owner, api="openai", status="queued", request={}, spec=spec, model="m")
        job.total_steps, job.priority = 2, priority  # as submission sets it from openrft.priority (runtime.priority)
        return store.create_job(job)

    def queue_four():
        a1, a2, a3, b1 = queue("alice"), queue("alice"), queue("alice", 5), queue("bob", 100)
        return [a3.id, b1.id, a1.id, a2.id]

    expected = queue_four()
    order = [store.claim_job("w").id for _ in range(4)]
    assert order == expected

    for job_id in order:  # done: a fresh start for the worker's turn
        store.finish(job_id, 1, "succeeded", "done")
    with store.session() as s:
        from openrft.service.store.models import Job

        s.execute(update(Job).values(claimed_at=None))
    expected = queue_four()
    worker = _worker(store, tmp_path)
    for _ in range(4):
        worker.tick()
        worker.running.clear()
    assert [job_id for job_id, _ in worker.launcher.started] == expected


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_cluster_page_without_a_cluster_shows_this_machine_and_each_tenant_only_its_own(store, tmp_path):
    """No --ray-address: one node, this machine; what the running jobs reserved (their attempts' rows); the queue
    and the quotas, a tenant seeing its own jobs and use, another tenant's job without its id, the operator all."""
    import os

    from openrft.service.dashboard.cluster import OTHERS, cluster_page

    worker = _worker(store, tmp_path, concurrency=1)
    spec = _spec(threads=2).model_dump(mode="json")
    running, waiting = _queued(store, spec, owner="alice"), _queued(store, spec, owner="bob")
    worker.tick()  # alice's starts, holding 2 CPUs; bob's waits for the one worker
    store.set_quota("bob", 100, None)
    store.set_queue_reason(waiting.id, "its turn")

    alice = cluster_page(store, worker.config, "alice")
    assert alice["source"] == "local" and [n["id"] for n in alice["nodes"]] == ["local"]
    assert alice["nodes"][0]["cpu"] == float(os.cpu_count()) and alice["nodes"][0]["held"]["cpu"] == 2.0
    assert [(h["job"], h["cpu"]) for h in alice["held"]] == [(running.id, 2.0)]
    assert alice["queue"] == {"jobs": [], "others_waiting": 1}
    assert [q["tenant"] for q in alice["quotas"]] == ["alice"] and alice["quotas"][0]["cpu_seconds"]["limit"] is None

    bob = cluster_page(store, worker.config, "bob")
    assert [(h["job"], h["name"], h["cpu"]) for h in bob["held"]] == [(None, OTHERS, 2.0)]
    assert [(j["job"], j["reason"]) for j in bob["queue"]["jobs"]] == [(waiting.id, "its turn")]
    assert bob["quotas"][0]["cpu_seconds"]["limit"] == 100

    operator = cluster_page(store, worker.config, "local")
    assert [h["job"] for h in operator["held"]] == [running.id]
    assert {q["tenant"] for q in operator["quotas"]} >= {"alice", "bob"}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_on_a_cluster_the_least_holding_tenant_goes_first_with_its_own_highest_priority_job(store, tmp_path):
    """With admission on a cluster (a stand-in answering its reservations and its 4 CPUs), the dominant share picks
    the tenant, whatever priorities say, and priority picks that tenant's job: alice holds half the cluster and
    queues a priority-100 job; bob holds nothing, so his turn comes, and it goes to his priority-50 job."""
    from openrft.service.admission import Decision
    from tests.service.test_admission import Shares

    worker = _worker(store, tmp_path)
    worker.config.ray_address = "head:6379"
    two_cpus = _spec(replicas=2).model_dump(mode="json")

    def queue(owner: str, priority: int = 0):
        from openrft.service.store.base import new_id
        from openrft.service.store.models import Job

        job = Job(id=new_id("ftjob-"), owner=owner, api="openai", status="queued", request={}, spec=two_cpus)
        job.model, job.total_steps, job.priority = "m", 2, priority
        return store.create_job(job)

    holding = queue("alice")
    worker.admission = Shares(Decision(group="g-0"))
    worker.tick()  # alice holds 2 of the 4 CPUs from now on
    worker.running.clear()
    queue("alice", 100)
    bob_low, bob_high = queue("bob"), queue("bob", 50)
    worker.admission = Shares(Decision(group="g-1"))
    worker.tick()
    assert [job_id for job_id, _ in worker.launcher.started] == [holding.id, bob_high.id]
    assert store.get_job(None, bob_low.id).status == "queued"
