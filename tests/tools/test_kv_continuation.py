"""The local generator's continuous decode batch: a conversation's kept KV cache continues its next turn with the
tokens and log-probs of a fresh prefill, a stale cache is never used, and requests join a running batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from openrft.rollout.local import TransformersGenerator
from openrft.rollout.types import Completion, SamplingParams
from tests.tiny_models import tiny_qwen2

MODEL = Path(__file__).resolve().parents[2] / "examples" / "calculator" / "model"
GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL)


@pytest.fixture
def generator(tokenizer) -> TransformersGenerator:
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    return TransformersGenerator(model, tokenizer, [tokenizer.eos_token_id], tokenizer.pad_token_id)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def questions(tokenizer) -> list[list[int]]:
    return [
        ids(tokenizer, f"<|im_start|>user\nWhat is {q}?<|im_end|>\n<|im_start|>assistant\n")
        for q in ("123*45", "907*38", "5*5")
    ]


def run(session) -> None:
    while session.busy:
        session.step()


def first_turns(session, contexts: list[list[int]], limit: int = 20) -> list[Completion]:
    out: dict[int, Completion] = {}
    for i, context in enumerate(contexts):
        session.submit(context, [limit], [lambda c, i=i: out.__setitem__(i, c)], [f"episode-{i}"])
    run(session)
    return [out[i] for i in range(len(contexts))]


def next_turns(session, contexts: list[list[int]], limit: int = 24) -> list[Completion]:
    return first_turns(session, contexts, limit)


def tool_result(tokenizer, first: Completion, result: str) -> list[int]:
    """The first turn's context, its tokens, a tool message and the next assistant header."""
    turn = ids(
        tokenizer, f"<|im_start|>user\n<tool_response>{result}</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    return first.prompt_ids + first.token_ids + turn


def assert_same(a: Completion, b: Completion) -> None:
    assert a.token_ids == b.token_ids
    assert a.finish_reason == b.finish_reason
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_kept_cache_continues_the_next_turn_as_a_fresh_prefill_would(generator, tokenizer):
    with generator.decoding(GREEDY) as session:
        firsts = first_turns(session, questions(tokenizer))
        contexts = [tool_result(tokenizer, f, r) for f, r in zip(firsts, ("5535", "34466", "25"))]
        prefilled = session.prefilled_tokens
        seconds = next_turns(session, contexts)
        assert session.store.hits == 3 and session.store.stale == 0
        new_tokens = session.prefilled_tokens - prefilled
        # only what the cache did not hold was read: each context's last sampled token and the tool turn
        assert new_tokens == sum(len(c) - len(f.prompt_ids) - len(f.token_ids) + 1 for c, f in zip(contexts, firsts))
        assert new_tokens < sum(len(c) for c in contexts) / 2
    for first, fresh in zip(firsts, generator.generate(questions(tokenizer), replace_limit(GREEDY, 20))):
        assert_same(first, fresh[0])
    for second, fresh in zip(seconds, generator.generate(contexts, GREEDY)):
        assert_same(second, fresh[0])
    assert any(len(s.token_ids) > 1 for s in seconds)


def replace_limit(params: SamplingParams, limit: int) -> SamplingParams:
    return SamplingParams(n=params.n, temperature=params.temperature, max_new_tokens=limit)


def perturb(generator: TransformersGenerator) -> None:
    """New weights (as a learner step would write) under a new policy version."""
    with torch.no_grad():
        for parameter in generator.model.model.layers[0].parameters():
            parameter.mul_(1.5)
    generator.set_policy_version(generator.policy_version + 1)


def test_a_cache_kept_under_an_older_policy_is_stale_and_the_turn_is_prefilled_afresh(generator, tokenizer):
    with generator.decoding(GREEDY) as session:
        firsts = first_turns(session, questions(tokenizer)[:2])
        contexts = [tool_result(tokenizer, f, "42") for f in firsts]
        perturb(generator)
        seconds = next_turns(session, contexts)
        assert session.store.hits == 0 and session.store.stale == 2
    for second, fresh in zip(seconds, generator.generate(contexts, GREEDY)):
        assert_same(second, fresh[0])


def test_reusing_a_stale_cache_would_be_caught(generator, tokenizer):
    """The control for the test above: with the version left as it was, the cache of the old weights is
    used, and the log-probs are no longer those of a fresh prefill under the new weights."""
    with generator.decoding(GREEDY) as session:
        firsts = first_turns(session, questions(tokenizer)[:2])
        contexts = [tool_result(tokenizer, f, "42") for f in firsts]
        version = generator.policy_version
        perturb(generator)
        generator.set_policy_version(version)
        seconds = next_turns(session, contexts)
        assert session.store.hits == 2
    fresh = generator.generate(contexts, GREEDY)
    assert any(s.logprobs != pytest.approx(f[0].logprobs, abs=1e-5) for s, f in zip(seconds, fresh))


def test_a_context_that_does_not_start_with_the_kept_tokens_is_prefilled_afresh(generator, tokenizer):
    with generator.decoding(GREEDY) as session:
        (first,) = first_turns(session, questions(tokenizer)[:1])
        context = tool_result(tokenizer, first, "5535")
        context[3] = ids(tokenizer, "9")[0]  # an earlier token differs from what the cache was built on
        (second,) = next_turns(session, [context])
        assert session.store.hits == 0 and session.store.stale == 1
    assert_same(second, generator.generate([context], GREEDY)[0][0])


@pytest.fixture
def tiny(tokenizer) -> TransformersGenerator:
    """A random model that never stops by itself (no end token): rows end at their limits."""
    torch.manual_seed(0)
    return TransformersGenerator(tiny_qwen2(len(tokenizer), 512).eval(), tokenizer, [], tokenizer.pad_token_id)


def test_a_request_joins_a_running_batch_and_each_row_is_handed_back_when_it_ends(tiny, tokenizer):
    long, short, late = questions(tokenizer)
    ended: list[tuple[str, int, Completion]] = []
    with tiny.decoding(GREEDY) as session:

        def done(name):
            return lambda c: ended.append((name, session.steps, c))

        session.submit(long, [30], [done("long")])
        for _ in range(5):
            session.step()
        session.submit(short, [3], [done("short")])
        session.submit(late, [4, 6], [done("late-a"), done("late-b")])  # two samples from one prefill
        session.step()
        assert len(session.rows) == 4  # joined while the long row is still decoding
        run(session)
    assert [(name, step) for name, step, _ in ended] == [("short", 8), ("late-a", 9), ("late-b", 11), ("long", 30)]
    fresh = {
        "long": tiny.generate([long], replace_limit(GREEDY, 30))[0][0],
        "short": tiny.generate([short], replace_limit(GREEDY, 3))[0][0],
        "late-b": tiny.generate([late], replace_limit(GREEDY, 6))[0][0],
    }
    by_name = {name: c for name, _, c in ended}
    for name, completion in fresh.items():
        assert_same(by_name[name], completion)  # joining and leaving a batch changes no row's tokens
    assert by_name["late-a"].token_ids == by_name["late-b"].token_ids[:4]


def test_a_row_whose_conversation_ends_there_keeps_no_cache(tiny, tokenizer):
    """A callback that returns False (the episode answered: no next turn) leaves nothing in the store."""
    long, short, _ = questions(tokenizer)
    with tiny.decoding(GREEDY) as session:
        session.submit(long, [3], [lambda c: False], ["answered"])
        session.submit(short, [3], [lambda c: None], ["calls-a-tool"])
        run(session)
        assert "answered" not in session.store and "calls-a-tool" in session.store
