"""The generator's recorded log-probs are the learner's log-probs of the same tokens (on-policy)."""

from dataclasses import replace

import torch

from openrft.learner.batch import TrainSample, collate
from openrft.learner.learner import response_logits, token_logp
from openrft.models import eos_token_ids, load_causal_lm, load_tokenizer
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.prompts import render_prompt
from openrft.rollout.sampling import filter_logits
from openrft.rollout.types import SamplingParams


def _setup():
    tokenizer = load_tokenizer("openrft-demo")
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    gen = TransformersGenerator(model, tokenizer, eos_token_ids(tokenizer, model), tokenizer.pad_token_id, seed=1)
    prompts = [
        render_prompt(tokenizer, [{"role": "user", "content": q}])
        for q in ("What is 12+7?", "What is 99-45?", "What is 3+4?")
    ]
    return tokenizer, model, gen, prompts


def test_behaviour_logprobs_match_training_forward():
    tokenizer, model, gen, prompts = _setup()
    params = SamplingParams(n=4, temperature=0.8, max_new_tokens=6)
    groups = gen.generate(prompts, params)
    assert [len(g) for g in groups] == [4, 4, 4]
    samples = [TrainSample(c.prompt_ids, c.token_ids, 0.0) for g in groups for c in g]
    mb = collate(samples, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        logp = token_logp(response_logits(model, mb, 0.8), mb.targets)
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        recorded = torch.tensor([c for g in groups for c in g][i].logprobs)
        assert torch.allclose(logp[i, :n], recorded, atol=1e-4), (logp[i, :n], recorded)


def test_completions_end_at_eos_and_text_excludes_it():
    tokenizer, _, gen, prompts = _setup()
    groups = gen.generate(prompts, SamplingParams(n=2, temperature=0.0, max_new_tokens=8))
    for group in groups:
        # greedy: both samples are the same
        assert group[0].token_ids == group[1].token_ids
        for c in group:
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in eos_token_ids(tokenizer, gen.model)
                assert "<|im_end|>" not in c.text
            assert len(c.token_ids) == len(c.logprobs) <= 8


def test_seeded_generation_is_reproducible_and_leaves_own_stream():
    _, _, gen, prompts = _setup()
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6)
    state = gen.rng.get_state()
    a = gen.generate(prompts, params, seed=5)
    b = gen.generate(prompts, params, seed=5)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    assert torch.equal(gen.rng.get_state(), state)


def test_top_k_and_top_p_filtering():
    logp = torch.log_softmax(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), -1)
    top2 = filter_logits(logp, top_k=2, top_p=1.0)
    assert torch.isfinite(top2).tolist() == [[True, True, False, False]]
    probs = logp.exp()[0]
    # nucleus with top_p just above p0 keeps the two most likely tokens
    nucleus = filter_logits(logp, top_k=0, top_p=float(probs[0]) + 0.01)
    assert torch.isfinite(nucleus).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filter_logits(logp, 0, 1.0)).all()


def test_max_length_caps_each_prompt_and_completion_not_the_longest_prompt():
    _, _, gen, prompts = _setup()
    gen.eos_token_ids = []  # no end token: every completion runs to its limit
    short, long = min(len(p) for p in prompts), max(len(p) for p in prompts)
    assert long > short
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=long - short + 3, max_length=long + 3)
    for prompt, group in zip(prompts, gen.generate(prompts, params), strict=True):
        for c in group:  # the context window is per sample: a long prompt does not shorten a short one's answer
            assert len(c.token_ids) == len(c.logprobs) == params.max_length - len(prompt)
            assert c.finish_reason == "length"
    assert params.completion_limit(short) == long - short + 3 and params.completion_limit(long) == 3


def test_ignore_eos_runs_every_answer_to_its_limit_in_both_decoders():
    """Every token made an end token: each answer ends at its first token, unless ``ignore_eos``."""
    _tokenizer, model, gen, prompts = _setup()
    gen.eos_token_ids = list(range(model.config.vocab_size))
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5)
    ended = [c for g in gen.generate(prompts, params, seed=3) for c in g]
    assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for c in ended)
    full = [c for g in gen.generate(prompts, replace(params, ignore_eos=True), seed=3) for c in g]
    assert all(len(c.token_ids) == 5 and c.finish_reason == "length" for c in full)

    for ignore_eos, length in ((False, 1), (True, 5)):
        out = []
        with gen.decoding(replace(params, ignore_eos=ignore_eos), seed=3) as session:
            session.submit(prompts[0], [5, 5], [out.append, out.append])
            while session.busy:
                session.step()
        assert [len(c.token_ids) for c in out] == [length, length]
