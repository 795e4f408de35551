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


def _parts_order(schedule: str) -> list[str]:
    futures = Futures(schedule)
    order: list[str] = []
    release = _held(futures, "C")

    def long_call():  # a forward_backward in chunks: a generator, one part per turn
        for i in range(3):
            order.append(f"A-part{i}")
            if i < 2:
                yield
        return "whole"

    ids = [futures.submit("A", long_call, ()), futures.submit("A", lambda: order.append("A-next"), ())]
    ids += [futures.submit("B", lambda i=i: order.append(f"B{i}"), ()) for i in range(2)]
    release.set()
    results = [futures.get(i, o).future.result(20) for i, o in zip(ids, "AABB")]
    assert results[0] == "whole"
    futures.close()
    return order


def test_another_tenants_calls_run_between_the_parts_of_a_long_call():
    assert _parts_order("fair") == ["A-part0", "B0", "A-part1", "B1", "A-part2", "A-next"]
    assert _parts_order("fifo") == ["A-part0", "A-part1", "A-part2", "A-next", "B0", "B1"]


def test_a_call_in_chunks_computes_what_it_computes_whole(monkeypatch):
    pytest.importorskip("tinker")
    import torch

    from openrft.service.tinker import engine as engine_module
    from openrft.service.tinker.engine import Engine, LoraSettings
    from openrft.service.tinker.wire import WireDatum

    engine = Engine()
    model = engine.create_model("s:train:0", "A", "openrft-demo", LoraSettings(rank=4, seed=0))
    for name, p in model.base.peft.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    tok = model.base.tokenizer
    texts = ["What is 12+30? 42", "What is 7-5? 2", "Say hello to the world", "What is 45+45? 90"]
    data = []
    for text in texts:
        ids = tok.encode(text)
        data.append(WireDatum(ids[:-1], {"target_tokens": torch.tensor(ids[1:]), "weights": torch.ones(len(ids) - 1)}))
    params = model.base.adapter_parameters(model.model_id)

    def run(chunk_tokens: int):
        monkeypatch.setattr(engine_module, "CHUNK_TOKENS", chunk_tokens)
        model.optimizer.zero_grad(set_to_none=True)
        steps = engine.forward_backward_steps(model, "cross_entropy", {}, data, True)
        parts = 0
        while True:
            try:
                next(steps)
                parts += 1
            except StopIteration as done:
                outputs, metrics = done.value
                return parts, outputs, metrics, [p.grad.clone() for p in params]

    whole_parts, whole, whole_metrics, whole_grads = run(4096)
    longest = max(len(d.tokens) for d in data)
    parts, chunked, metrics, grads = run(longest)  # about one datum a chunk, none in pieces
    assert whole_parts == 0 and parts == len(engine_module._chunks(data, longest)) - 1 >= 2
    assert metrics["loss:sum"] == pytest.approx(whole_metrics["loss:sum"], rel=1e-5)
    for a, b in zip(chunked["logprobs"], whole["logprobs"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for a, b in zip(grads, whole_grads):  # the same sums, in another order and padding: float32's rounding apart
        assert float((a - b).norm()) <= 1e-4 * float(b.norm()) + 1e-7, (float((a - b).norm()), float(b.norm()))

    # a later chunk whose loss is not finite: the gradients go back to what they were before the call
    bad = WireDatum(data[0].tokens, {**data[0].inputs, "weights": torch.full((len(data[0].tokens),), 3e38)})
    before = [p.grad.clone() for p in params]
    with pytest.raises(Exception, match="not finite"):
        engine.forward_backward(model, "cross_entropy", {}, [*data[:2], bad], True)
    for a, b in zip(params, before):
        torch.testing.assert_close(a.grad, b, atol=0, rtol=0)


def _drive(steps, stop_after: int | None = None):
    """Runs a call's generator to its end (its value and how many parts it yielded between), or closes it after
    ``stop_after`` parts as the worker does for a cancelled call."""
    parts = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, parts
        parts += 1
        if parts == stop_after:
            steps.close()
            return None, parts


@pytest.fixture
def long_datum_model():
    pytest.importorskip("tinker")
    import torch

    from openrft.service.tinker.engine import Engine, LoraSettings
    from openrft.service.tinker.wire import WireDatum

    engine = Engine()
    model = engine.create_model("s:train:0", "A", "openrft-demo", LoraSettings(rank=4, seed=0))
    for name, p in model.base.peft.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 90, (61,), generator=generator).tolist()
    inputs = {
        "target_tokens": torch.tensor(tokens[1:]),
        "weights": torch.rand(60, generator=generator),
        "logprobs": -torch.rand(60, generator=generator),  # the sampler's, for the importance-weighted losses
        "advantages": torch.randn(60, generator=generator),
    }
    return engine, model, WireDatum(tokens[:-1], inputs)


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "ppo"])
def test_a_long_datum_in_pieces_computes_what_it_computes_whole(monkeypatch, long_datum_model, loss_fn):
    """A datum longer than a chunk runs in pieces along its sequence (pieces.py), other tenants' calls between
    them: the same log-probs, loss and gradient as in one pass."""
    import torch

    from openrft.service.tinker import engine as engine_module

    engine, model, datum = long_datum_model
    if loss_fn == "cross_entropy":
        datum.inputs = {k: datum.inputs[k] for k in ("target_tokens", "weights")}
    else:
        datum.inputs = {k: v for k, v in datum.inputs.items() if k != "weights"}
    params = model.base.adapter_parameters(model.model_id)

    def run(chunk_tokens: int, piece_tokens: int):
        monkeypatch.setattr(engine_module, "CHUNK_TOKENS", chunk_tokens)
        monkeypatch.setattr(engine_module, "PIECE_TOKENS", piece_tokens)
        model.optimizer.zero_grad(set_to_none=True)
        (outputs, metrics), parts = _drive(engine.forward_backward_steps(model, loss_fn, {}, [datum], True))
        return parts, outputs["logprobs"][0], metrics["loss:sum"], [p.grad.clone() for p in params]

    whole_parts, whole_logp, whole_loss, whole_grads = run(4096, 4096)
    parts, logp, loss, grads = run(16, 8)  # 60 tokens: 8 pieces, each forward and backward a part of its own
    assert whole_parts == 0 and parts == 2 * 8 - 1
    assert loss == pytest.approx(whole_loss, rel=1e-5)
    torch.testing.assert_close(logp, whole_logp, atol=1e-5, rtol=0)
    for a, b in zip(grads, whole_grads):
        assert float((a - b).norm()) <= 1e-4 * float(b.norm()) + 1e-7, (float((a - b).norm()), float(b.norm()))


def test_a_call_stopped_between_its_parts_leaves_the_gradients_as_they_were(monkeypatch, long_datum_model):
    """What the worker does for a cancelled call (futures.py): the generator closed between two parts, in its
    forward pieces and in its backward pieces; the gradients accumulated before the call stay, nothing of it."""
    from openrft.service.tinker import engine as engine_module

    engine, model, datum = long_datum_model
    datum.inputs = {k: datum.inputs[k] for k in ("target_tokens", "weights")}
    monkeypatch.setattr(engine_module, "CHUNK_TOKENS", 16)
    monkeypatch.setattr(engine_module, "PIECE_TOKENS", 8)
    params = model.base.adapter_parameters(model.model_id)
    short = type(datum)(datum.tokens[:10], {k: v[:10] for k, v in datum.inputs.items()})
    engine.forward_backward(model, "cross_entropy", {}, [short], True)
    before = [p.grad.clone() for p in params]
    for stop_after in (3, 10, 14):  # in the forward pieces; in the backward pieces; one before its end
        _, parts = _drive(engine.forward_backward_steps(model, "cross_entropy", {}, [datum, datum], True), stop_after)
        assert parts == stop_after
        for p, grad in zip(params, before):
            assert p.grad is not None and bool((p.grad == grad).all())


def _long_call(order: list[str], cleaned: list[str], name: str, parts: int = 5, part_s: float = 0.0):
    def call():
        try:
            for i in range(parts):
                order.append(f"{name}-part{i}")
                time.sleep(part_s)
                if i < parts - 1:
                    yield
        finally:
            cleaned.append(name)
        return "whole"

    return call


def test_cancel_drops_a_queued_call_and_stops_a_running_one_at_its_next_part():
    futures = Futures()
    order: list[str] = []
    cleaned: list[str] = []
    release = _held(futures, "C")
    running = futures.submit("A", _long_call(order, cleaned, "A", 100, 0.05), ())
    queued = futures.submit("A", lambda: order.append("A-next"), ())
    other = futures.submit("B", lambda: "B", ())
    assert futures.cancel(queued, "B") is None  # another tenant's id reads as not found
    assert futures.cancel(queued, "A") == "dropped"
    release.set()
    futures.get(other, "B").future.result(20)  # B's first part ran after A's first: A is running in parts now
    assert futures.cancel(running, "A") == "stopping"
    result = futures.get(running, "A").future.result(20)
    assert isinstance(result, Failure) and "cancelled between its parts" in result.message
    assert "cancel_future" in futures.get(queued, "A").future.result(1).message
    assert cleaned == ["A"]  # the stopped call's own cleanup ran
    assert "A-next" not in order and "A-part99" not in order
    assert futures.cancel(running, "A") == "finished"
    futures.close()


def test_a_session_without_heartbeats_has_its_calls_dropped_and_stopped():
    """A client gone: its session's heartbeats stopped, though its futures are still being retrieved (so only
    the heartbeat can tell); another session's heartbeat keeps its calls."""
    futures = Futures(abandon_s=0.4)
    order: list[str] = []
    cleaned: list[str] = []
    futures.beat("gone")
    futures.beat("here")
    release = _held(futures, "C")
    running = futures.submit("A", _long_call(order, cleaned, "gone", 100, 0.05), (), session="gone")
    queued = futures.submit("A", lambda: order.append("gone-next"), (), session="gone")
    kept = futures.submit("B", _long_call(order, cleaned, "here", 3), (), session="here")
    release.set()
    deadline = time.monotonic() + 20
    while not futures.get(running, "A").future.done() and time.monotonic() < deadline:
        futures.beat("here")
        futures.get(queued, "A")  # its futures retrieved all along
        time.sleep(0.05)
    result = futures.get(running, "A").future.result(1)
    assert isinstance(result, Failure) and "session gone sent no heartbeat" in result.message, result
    assert "session gone sent no heartbeat" in futures.get(queued, "A").future.result(5).message
    assert futures.get(kept, "B").future.result(5) == "whole"
    assert "gone-next" not in order and "gone" in cleaned
    futures.close()
