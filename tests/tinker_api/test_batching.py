"""How the Tinker server schedules its work (futures.py, engine.py), the demo model in-process, seconds: samples
that reach it one by one join the batch already decoding, each answered once with its own prompt's samples and
the sampler's log-probs; a request a batch took and did not answer fails, one it did not take runs in the next
batch; sampling and learning each measure their thread count; each step's row says where the time went."""

from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("tinker")
from tinker import types

from openrft.engine.phase_threads import PhaseThreads
from openrft.service.tinker.engine import Engine, LoraSettings
from openrft.service.tinker.futures import Failure, Futures, Queued
from openrft.service.tinker.prefix import whole_logprobs
from openrft.service.tinker.wire import WireDatum


@pytest.fixture(scope="module")
def engine():
    engine = Engine()
    model = engine.create_model("m", "local", "openrft-demo", LoraSettings(rank=4, seed=0))
    for name, p in model.base.peft.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)  # a live adapter: the sampler's weights are not the base model's
    return engine, model


def test_a_prompt_arriving_mid_decode_joins_the_running_batch(engine):
    engine, model = engine
    sampler = engine.snapshot_sampler("s", model)
    tok = model.base.tokenizer
    prompts = [tok.encode(f"What is {x}? ") for x in ("12+30", "7-5", "45+45")]
    params = types.SamplingParams(max_tokens=5, temperature=1.0)
    answers: dict[int, tuple] = {}
    late = [
        [Queued(prompts[1], lambda r: answers.__setitem__(1, r))],
        [Queued(prompts[2], lambda r: answers.__setitem__(2, r))],
    ]
    asked = []

    def more() -> list[Queued]:
        asked.append(len(answers))
        return late.pop(0) if late else []

    engine.sample(sampler, 3, params, True, [Queued(prompts[0], lambda r: answers.__setitem__(0, r))], more)
    assert sorted(answers) == [0, 1, 2]
    assert asked[:2] == [0, 0]  # both late prompts were admitted before the first one had its answer
    engine._ready(sampler)
    for i, prompt in enumerate(prompts):
        sequences, prompt_lp = answers[i]
        assert len(sequences) == 3 and len(prompt_lp) == len(prompt)
        for seq in sequences:
            assert 1 <= len(seq.tokens) == len(seq.logprobs) <= 5
            full = prompt + seq.tokens
            with torch.no_grad():
                lp = whole_logprobs(model.base.peft, [full[:-1]], [torch.tensor(full[1:])], model.base.pad)[0]
            torch.testing.assert_close(torch.tensor(seq.logprobs), lp[len(prompt) - 1 :], atol=1e-4, rtol=0)


def test_a_batch_answers_what_it_took_and_leaves_the_rest_to_the_next():
    futures = Futures()
    release = threading.Event()
    batches: list[list[str]] = []

    def run(first: list[Queued], more) -> None:
        release.wait(10)
        taken = first + (more() if len(batches) == 0 else [])
        batches.append([q.payload for q in taken])
        for q in taken:
            if q.payload != "dropped":
                q.deliver(f"answer to {q.payload}")

    ids = [futures.submit_batched("t", ("k",), "a", run, ())]
    ids.append(futures.submit_batched("t", ("k",), "dropped", run, ()))
    ids.append(futures.submit_batched("t", ("other",), "c", run, ()))
    release.set()
    results = [futures.get(i, "t").future.result(10) for i in ids]
    assert results[0] == "answer to a"
    assert isinstance(results[1], Failure) and results[1].category == "server"
    assert results[2] == "answer to c"
    assert futures.get(ids[0], "someone else") is None
    futures.close()


def test_sampling_and_learning_each_measure_their_thread_count(engine):
    engine, model = engine
    engine.threads = PhaseThreads(2)  # as on an idle 2-core machine: a warm-up at 2 and at 1, each measured twice
    sampler = engine.snapshot_sampler("s2", model)
    prompt = model.base.tokenizer.encode("What is 2+2? ")
    datum = WireDatum(prompt[:-1], {"target_tokens": torch.tensor(prompt[1:]), "weights": torch.ones(len(prompt) - 1)})
    for _ in range(6):  # a warm-up at each candidate count, then two runs at each, interleaved
        engine.sample(sampler, 2, types.SamplingParams(max_tokens=3), False, [Queued(prompt, lambda r: None)], list)
        engine.forward_backward(model, "cross_entropy", {}, [datum], backward=True)
    assert {name: phase.chosen in ((1, 1), (1, 2)) for name, phase in engine.threads.phases.items()} == {
        "generate": True,
        "learn": True,
    }
    assert set(engine.threads.metrics()) == {"perf/threads_generate", "perf/threads_learn"}


def test_a_steps_row_says_where_the_servers_time_went(engine):
    engine, model = engine
    prompt = model.base.tokenizer.encode("What is 2+2? ")
    datum = WireDatum(prompt[:-1], {"target_tokens": torch.tensor(prompt[1:]), "weights": torch.ones(len(prompt) - 1)})
    adam = types.AdamParams(learning_rate=1e-3)
    rows = []
    for i in range(2):
        sampler = engine.snapshot_sampler(f"timed{i}", model)
        engine.sample(sampler, 2, types.SamplingParams(max_tokens=3), False, [Queued(prompt, lambda r: None)], list)
        engine.forward_backward(model, "cross_entropy", {}, [datum], backward=True)
        engine.optim_step(model, adam)
        rows.append(engine.take_pending(model))
    calls = {
        f"time/{name}{kind}"
        for name in ("publish", "sample", "forward_backward", "optim_step")
        for kind in ("_s", "_cpu_s")
    }
    assert calls <= set(rows[0]) and "time/step_s" not in rows[0]  # the first step has no step before it
    assert calls | {"time/step_s", "time/server_cpu_s"} <= set(rows[1])
    assert rows[1]["time/step_s"] >= rows[1]["time/sample_s"] + rows[1]["time/forward_backward_s"] > 0
