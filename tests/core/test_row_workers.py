"""On CPU with several torch threads, ``generate`` splits the prompts between Python threads, one torch thread each
(``openrft.rollout.local.row_workers``): every prompt's group comes back in order, on-policy, reproducibly."""

import threading

import torch

from openrft.learner.batch import TrainSample, collate
from openrft.learner.learner import response_logits, token_logp
from openrft.models import eos_token_ids, load_causal_lm, load_tokenizer
from openrft.rollout.local import TransformersGenerator, row_workers, split_evenly
from openrft.rollout.prompts import render_prompt
from openrft.rollout.types import SamplingParams

QUESTIONS = ("What is 12+7?", "What is 99-45?", "What is 3+4?", "What is 8*8?", "What is 10-1?")


def _generator():
    tokenizer = load_tokenizer("openrft-demo")
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    gen = TransformersGenerator(model, tokenizer, eos_token_ids(tokenizer, model), tokenizer.pad_token_id, seed=1)
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    return tokenizer, model, gen, prompts


def test_split_evenly_keeps_order_and_balances_lengths():
    assert split_evenly(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_evenly(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_evenly([1], 1) == [[1]]


def test_row_workers_one_per_thread_at_most_one_per_prompt_cpu_only():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert row_workers(2, 8, cpu) == 2
    assert row_workers(4, 3, cpu) == 3
    assert row_workers(1, 8, cpu) == 1
    assert row_workers(2, 0, cpu) == 1
    assert row_workers(8, 8, gpu) == 1


def test_two_threads_decode_the_prompts_in_two_python_threads_of_one_torch_thread_each(monkeypatch):
    tokenizer, model, gen, prompts = _generator()
    seen: list[tuple[str, int, int]] = []
    chunk = gen._generate_chunk

    def recording(part, params, rng):
        seen.append((threading.current_thread().name, torch.get_num_threads(), len(part)))
        return chunk(part, params, rng)

    monkeypatch.setattr(gen, "_generate_chunk", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        groups = gen.generate(prompts, SamplingParams(n=3, temperature=0.9, max_new_tokens=6))
        assert torch.get_num_threads() == 2  # the caller's setting is back
    finally:
        torch.set_num_threads(before)
    assert sorted(size for _, _, size in seen) == [2, 3]
    assert {threads for _, threads, _ in seen} == {1}
    assert len({name for name, _, _ in seen}) == 2 and all(n.startswith("openrft-rows") for n, _, _ in seen)
    # each group is its own prompt's, in order, with the policy's log-probs of its tokens
    assert [[c.prompt_ids for c in g] for g in groups] == [[p] * 3 for p in prompts]
    samples = [TrainSample(c.prompt_ids, c.token_ids, 0.0) for g in groups for c in g]
    mb = collate(samples, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        logp = token_logp(response_logits(model, mb, 0.9), mb.targets)
    recorded = [c.logprobs for g in groups for c in g]
    for i, sample in enumerate(samples):
        n = len(sample.response_ids)
        assert torch.allclose(logp[i, :n], torch.tensor(recorded[i]), atol=1e-4)


def test_split_generation_is_reproducible_and_its_workers_draw_different_streams():
    _, _, gen, prompts = _generator()
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = gen.generate([prompts[0]] * 4, params, seed=7)
        b = gen.generate([prompts[0]] * 4, params, seed=7)
    finally:
        torch.set_num_threads(before)
    tokens = [[c.token_ids for c in g] for g in a]
    assert tokens == [[c.token_ids for c in g] for g in b]
    assert tokens[:2] != tokens[2:]  # the same prompts in both halves: the two streams differ
