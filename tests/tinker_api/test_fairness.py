"""Fair among tenants (issue 49 point 6, futures.py): each tenant's calls queue apart and the worker serves the
tenants in turn, so another tenant's call waits for the one already running, not for a tenant's backlog; a
tenant's own calls keep their order; a queued call nobody retrieves (a disconnected client), or whose session
finished, never runs; a finished session's training client leaves memory. Orders and counts, no timings: the
worker is held on an event while the queues fill."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from openrft.service.tinker.futures import Failure, Futures, Queued


def _held(futures: Futures, owner: str = "A") -> threading.Event:
    """The worker busy with a call of ``owner`` until the event is set."""
    release, running = threading.Event(), threading.Event()

    def hold() -> str:
        running.set()
        release.wait(20)
        return "held"

    futures.submit(owner, hold, ())
    assert running.wait(10)
    return release


def _run_order(schedule: str) -> list[str]:
    futures = Futures(schedule)
    order: list[str] = []
    release = _held(futures)
    ids = [futures.submit("A", lambda i=i: order.append(f"A{i}"), ()) for i in range(10)]  # A's backlog
    ids.append(futures.submit("B", lambda: order.append("B"), ()))  # B's short call, after all of A's

    def batch(first: list[Queued], more) -> None:
        order.append("B-sample")
        for q in first + more():
            q.deliver("ok")

    ids += [futures.submit_batched("B", ("sampler",), i, batch, ()) for i in range(3)]
    release.set()
    for request_id in ids:
        futures.get(request_id, "A" if request_id in ids[:10] else "B").future.result(20)
    futures.close()
    return order


def test_another_tenants_call_waits_for_the_running_one_not_the_backlog():
    order = _run_order("fair")
    # B's call runs as soon as A's running call ends, its samples at its next turn (after one more of A's), as
    # one batch; A's own calls stay in their order
    assert order[:3] == ["B", "A0", "B-sample"]
    assert [x for x in order if x.startswith("A")] == [f"A{i}" for i in range(10)]
    assert order.count("B-sample") == 1


def test_fifo_keeps_the_old_arrival_order():
    order = _run_order("fifo")
    assert order == [*(f"A{i}" for i in range(10)), "B", "B-sample"]


def test_a_queued_call_nobody_retrieves_is_dropped_before_it_runs():
    futures = Futures(abandon_s=0.3)
    release = _held(futures, "B")
    ran: list[str] = []
    gone = [futures.submit("A", lambda i=i: ran.append(f"gone{i}"), ()) for i in range(3)]
    gone_sample = futures.submit_batched("A", ("s",), "p", lambda first, more: ran.append("sample"), ())
    polled = futures.submit("C", lambda: ran.append("polled"), ())
    items = [futures.get(request_id, "A") for request_id in (*gone, gone_sample)]  # asked for once, then no more
    time.sleep(0.6)  # past the bound with nobody asking for A's calls
    futures.get(polled, "C")  # C's client is still there: it retrieves (the SDK polls from the start)
    release.set()
    assert futures.get(polled, "C").future.result(20) is None
    for item in items:
        result = item.future.result(20)
        assert isinstance(result, Failure) and "cancelled before it ran" in result.message
    assert ran == ["polled"]
    futures.close()


def test_a_finished_sessions_queued_calls_never_run():
    futures = Futures()
    release = _held(futures)
    ran: list[str] = []
    dropped = [futures.submit("A", lambda: ran.append("s1"), (), session="s1") for _ in range(3)]
    kept = futures.submit("A", lambda: ran.append("s2"), (), session="s2")
    assert futures.drop_session("s1", "session s1 finished") == 3
    release.set()
    futures.get(kept, "A").future.result(20)
    assert ran == ["s2"]
    assert all("session s1 finished" in futures.get(i, "A").future.result(1).message for i in dropped)
    futures.close()


def test_a_freed_training_client_leaves_memory():
    pytest.importorskip("tinker")
    from openrft.service.tinker.engine import Engine, LoraSettings

    engine = Engine()
    model = engine.create_model("sess:train:0", "A", "openrft-demo", LoraSettings(rank=4, seed=0))
    other = engine.create_model("sess2:train:0", "A", "openrft-demo", LoraSettings(rank=4, seed=0))
    engine.snapshot_sampler("smp", model)
    held, optimizer = weakref.ref(model), weakref.ref(model.optimizer)
    del model
    engine.free_model("sess:train:0")
    gc.collect()
    assert held() is None and optimizer() is None
    assert "smp" not in engine.samplers and "sess:train:0" not in engine.models
    assert "sess:train:0" not in other.base.peft.peft_config  # its adapter left the shared base model
    assert other.base.peft.active_adapter == "sess2:train:0"
