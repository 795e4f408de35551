"""The shared-prefix attention (prefix_attention.py) gives the learner's log-probs and gradients of SDPA over the
prompt cache gathered onto every row, holding each prompt's keys once."""

import pytest
import torch
from transformers import DynamicCache

import openrft.attention as attention
import openrft.prefix_attention as prefix_attention
import openrft.rollout.local as local
from openrft.learner.batch import TrainSample, collate
from openrft.learner.checkpointing import enable_activation_checkpointing
from openrft.learner.learner import response_logits
from openrft.models import eos_token_ids, load_causal_lm, load_tokenizer
from openrft.prefix_attention import PrefixGroups, SharedPrefix, SharedPrefixLayer, share_prefix
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.prompts import render_prompt
from openrft.rollout.types import SamplingParams
from tests.core.test_long_context import _logp_and_grads
from tests.tiny_models import tiny_qwen2


def _model():
    torch.manual_seed(0)
    model = tiny_qwen2(64, 128, attention_dropout=0.0)
    assert attention.use_chunked_sdpa(model)
    return model


def _batch(shuffled: bool):
    """Prompts of 5, 2 and 9 tokens (left padding) with 3, 1 and 2 responses of different lengths (right
    padding); ``shuffled``: the rows not in prompt order."""
    g = torch.Generator().manual_seed(2)
    samples = []
    for p, n in ((5, 3), (2, 1), (9, 2)):
        prompt = torch.randint(1, 64, (p,), generator=g).tolist()
        for k in range(n):
            samples.append(TrainSample(prompt, torch.randint(1, 64, (2 + 3 * k + p % 4,), generator=g).tolist(), 1.0))
    if shuffled:
        samples = [samples[i] for i in (4, 0, 3, 5, 2, 1)]
    mb = collate(samples, 0, torch.device("cpu"))
    if shuffled:
        assert mb.prompt_index.tolist() != sorted(mb.prompt_index.tolist())
    return mb


def _shared_runs(monkeypatch) -> list[int]:
    """Counts the shared-prefix attentions that run; taken whatever the responses' length (head_dim 4 would
    otherwise keep responses of more than 2 tokens on the gathered cache)."""
    monkeypatch.setattr(prefix_attention, "MEMORY_RATIO", 100.0)
    runs = []
    monkeypatch.setattr(
        attention, "prefix_attention", lambda *a, _f=prefix_attention.prefix_attention: runs.append(1) or _f(*a)
    )
    return runs


def _gathered(model, mb, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(prefix_attention, "MEMORY_RATIO", 0.0)  # the gathered cache
        return _logp_and_grads(model, mb)


def _assert_same(got, want, mb):
    (logp, grads), (want_logp, want_grads) = got, want
    mask = mb.response_mask.bool()
    assert torch.allclose(logp[mask], want_logp[mask], rtol=1e-5, atol=1e-6)
    for g, w in zip(grads, want_grads, strict=True):
        assert torch.allclose(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shuffled", [False, True])
def test_the_shared_prefix_gives_the_gathered_caches_logprobs_and_gradients(monkeypatch, shuffled):
    model, mb = _model(), _batch(shuffled)
    runs = _shared_runs(monkeypatch)
    want = _gathered(model, mb, monkeypatch)
    assert not runs
    got = _logp_and_grads(model, mb)
    assert len(runs) == model.config.num_hidden_layers  # every layer's responses attended to the shared prompt
    _assert_same(got, want, mb)


def test_the_shared_prefix_under_activation_checkpointing(monkeypatch):
    model, mb = _model().train(), _batch(shuffled=True)
    want = _gathered(model, mb, monkeypatch)
    enable_activation_checkpointing(model)
    runs = _shared_runs(monkeypatch)
    got = _logp_and_grads(model, mb)
    assert len(runs) == 2 * model.config.num_hidden_layers  # forward, then the recompute in backward
    _assert_same(got, want, mb)


def test_keys_changed_between_the_cache_and_the_attention_are_caught(monkeypatch):
    """A model whose keys lose the cache's tag would have its responses attend only to themselves: SDPA refuses
    them against the mask of prompt and response, and where no mask stops it the layers' counts do."""
    model, mb = _model(), _batch(shuffled=False)
    monkeypatch.setattr(prefix_attention, "MEMORY_RATIO", 100.0)
    update = SharedPrefixLayer.update
    monkeypatch.setattr(SharedPrefixLayer, "update", lambda self, k, v, *a, **kw: (update(self, k, v)[0].clone(), v))
    with pytest.raises(RuntimeError, match="size of tensor a"):
        response_logits(model, mb, 1.0)
    layer = SharedPrefixLayer.__new__(SharedPrefixLayer)
    layer.tagged, layer.attended = 1, 0
    with pytest.raises(RuntimeError, match="layer 0: 1 cache updates but 0 shared-prefix attentions"):
        SharedPrefix([layer]).check()


def test_rows_are_laid_out_by_prompt():
    mask = torch.ones(3, 4)
    grouped = PrefixGroups.build(torch.tensor([0, 0, 1, 1, 2, 2]), mask, torch.ones(6, 2))
    assert grouped.per_prompt == 2 and grouped.slots is None  # already in prompt order: no copies
    uneven = PrefixGroups.build(torch.tensor([2, 0, 1, 0, 2, 0]), mask, torch.ones(6, 2))
    assert uneven.per_prompt == 3 and uneven.slots.tolist() == [6, 0, 3, 1, 7, 2]
    rows = torch.arange(6.0)
    slots = uneven.to_slots(rows)
    assert slots.tolist() == [1, 3, 5, 2, 0, 0, 0, 4, 0] and torch.equal(uneven.to_rows(slots), rows)
    own = PrefixGroups.build(torch.tensor([0]), mask[:1], torch.tensor([[1, 1, 0]])).own_visible(3, 3)[0]
    assert own.tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    decoding = PrefixGroups.build(torch.tensor([0]), mask[:1]).own_visible(1, 4)  # the last token sees all its own
    assert decoding.tolist() == [[[True, True, True, True]]]
    kept = uneven.rows_kept(torch.tensor([1, 2, 4]))  # prompts 0, 1, 2 keep one row each
    assert kept.per_prompt == 1 and kept.slots is None and kept.prompt_index.tolist() == [0, 1, 2]


def test_long_responses_keep_the_gathered_cache():
    """The shared prefix keeps ``[rows, heads, queries, keys]`` scores for backward: taken only while they take no
    more memory than the gathered keys and values would (heads x queries <= kv_heads x head_dim)."""
    config = _model().config  # 4 heads, 2 key/value heads of width 4

    def shared(queries: int) -> bool:
        cache = DynamicCache()
        for layer in range(config.num_hidden_layers):
            cache.update(torch.zeros(3, 2, 5, 4), torch.zeros(3, 2, 5, 4), layer)
        return share_prefix(config, cache, lambda: None, queries) is not None

    assert shared(2) and not shared(3)


def test_the_generator_samples_the_same_from_prompts_held_once(monkeypatch):
    """Decoding on the shared prompt cache (the rows' own keys growing, ended rows dropped on the way) draws the
    same tokens with the same log-probs as decoding on copies of it."""
    tokenizer = load_tokenizer("openrft-demo")
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    gen = TransformersGenerator(model, tokenizer, eos_token_ids(tokenizer, model), tokenizer.pad_token_id, seed=1)
    questions = ("What is 12+7?", "What is 3+4?")
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    params = SamplingParams(n=6, temperature=1.0, max_new_tokens=6)
    monkeypatch.setattr(local, "COMPACT_FRACTION", 0.01)  # drop ended rows as soon as one ends
    runs, kept = _shared_runs(monkeypatch), []
    select = SharedPrefixLayer.batch_select_indices
    monkeypatch.setattr(SharedPrefixLayer, "batch_select_indices", lambda self, i: kept.append(i) or select(self, i))
    shared = gen.generate(prompts, params, seed=5)
    assert runs and kept  # the shared cache decoded, and rows were dropped from it
    with monkeypatch.context() as m:
        m.setattr(prefix_attention, "MEMORY_RATIO", 0.0)
        copied = gen.generate(prompts, params, seed=5)
    for group, want_group in zip(shared, copied, strict=True):
        for got, want in zip(group, want_group, strict=True):
            assert got.token_ids == want.token_ids
            assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-5)
