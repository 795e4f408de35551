"""The official ``tinker`` SDK's ``forward_backward`` with ``gspo`` and ``stable_reinforce`` against a real
``openrft serve`` (the demo model): each loss against the formula computed here from the learner's own
log-probs, stable_reinforce's recorded log-probs from sampling with ``record_stability_info=True`` and the
datum's ``sequence_id`` provenance, and the refusals when that provenance is missing or wrong."""

from __future__ import annotations

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.types import PromptProvenanceSpan, SampledProvenanceSpan  # noqa: E402

from tests.tinker_api.test_sdk import client, learner_logprobs, sequence, server, tokenizer, trainer  # noqa: E402, F401


def test_gspo_is_the_documented_sequence_ratio_loss(client, tokenizer):  # noqa: F811
    tc = trainer(client)
    tokens = sequence(tokenizer)
    n = len(tokens) - 1
    lp = learner_logprobs(tc, tokens).astype(np.float64)
    rng = np.random.default_rng(1)
    q = lp + rng.uniform(-0.3, 0.3, n)
    adv = rng.normal(size=n)
    in_ratio = np.zeros(n)
    in_ratio[n // 2 :] = 1  # the answer's half: the sequence ratio over those tokens only
    d = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": q.astype(np.float32),
            "advantages": adv.astype(np.float32),
            "sequence_ratio_mask": in_ratio.astype(np.float32),
        },
    )
    s = np.exp(np.mean((lp - q)[in_ratio == 1]))
    for config, (low, high) in (
        (None, (1 - 3e-4, 1 + 4e-4)),
        ({"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}, (0.5, 2.0)),
    ):
        expected = -np.minimum(s * adv, np.clip(s, low, high) * adv).sum()
        out = tc.forward([d], "gspo", loss_fn_config=config).result()
        assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4), config
    assert abs(s - 1) > 1e-3  # the default bounds bite
    tc.forward_backward([d], "gspo", loss_fn_config={"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}).result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert np.abs(learner_logprobs(tc, tokens) - lp).max() > 1e-4  # it trained


def test_stable_reinforce_takes_the_log_probs_recorded_at_sampling(client, tokenizer):  # noqa: F811
    tc = trainer(client, seed=3)
    prompt = tokenizer.encode("What is 2+3?")
    sampler = tc.save_weights_and_get_sampling_client(record_stability_info=True).result()
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5)
    sampled = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result().sequences
    assert len({s.sequence_id for s in sampled}) == 2

    # move the policy away from the sampler's snapshot, so the ratios are not 1
    warm = sequence(tokenizer)
    tc.forward_backward(
        [
            types.Datum(
                model_input=types.ModelInput.from_ints(warm[:-1]),
                loss_fn_inputs={"target_tokens": warm[1:], "weights": np.ones(len(warm) - 1, np.float32)},
            )
        ],
        "cross_entropy",
    ).result()
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()

    data, expected = [], 0.0
    for i, seq in enumerate(sampled):
        tokens = prompt + seq.tokens
        n = len(tokens) - 1
        adv = np.zeros(n)
        adv[len(prompt) - 1 :] = 1.0 if i == 0 else -0.5  # the sampled tokens' advantage; 0 on the prompt
        base = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "advantages": adv.astype(np.float32)},
        )
        data.append(
            base.with_provenance(
                model_input=[
                    PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=0, length=len(prompt)),
                    SampledProvenanceSpan(sequence_id=seq.sequence_id, offset=0, length=len(seq.tokens) - 1),
                ],
                loss_fn_inputs=[
                    PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=1, length=len(prompt) - 1),
                    SampledProvenanceSpan(sequence_id=seq.sequence_id, offset=0, length=len(seq.tokens)),
                ],
            )
        )
        lp = learner_logprobs(tc, tokens).astype(np.float64)[len(prompt) - 1 :]
        ratio = np.exp(lp - np.asarray(seq.logprobs, np.float64))
        weight = np.where((ratio >= 0.5) & (ratio <= 2.0), ratio, 0.0)
        expected += -(weight * adv[len(prompt) - 1 :]).sum()
        assert np.abs(ratio - 1).max() > 1e-3
    out = tc.forward(data, "stable_reinforce").result()
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4)
    before = learner_logprobs(tc, prompt + sampled[0].tokens)
    tc.forward_backward(data, "stable_reinforce").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert np.abs(learner_logprobs(tc, prompt + sampled[0].tokens) - before).max() > 1e-4

    # what it refuses, naming the datum and the field
    plain = types.Datum(model_input=data[0].model_input, loss_fn_inputs=data[0].loss_fn_inputs)
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\] has no provenance: stable_reinforce"):
        tc.forward([plain], "stable_reinforce").result()
    seq = sampled[0]
    wrong = list(prompt + seq.tokens)
    wrong[-1] = (wrong[-1] + 1) % 100
    bad = types.Datum(
        model_input=types.ModelInput.from_ints(wrong[:-1]),
        loss_fn_inputs={"target_tokens": wrong[1:], "advantages": np.ones(len(wrong) - 1, np.float32)},
    ).with_provenance(
        model_input=[SampledProvenanceSpan(sequence_id=seq.sequence_id, offset=0, length=len(wrong) - 1)],
        loss_fn_inputs=[
            PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=1, length=len(prompt) - 1),
            SampledProvenanceSpan(sequence_id=seq.sequence_id, offset=0, length=len(seq.tokens)),
        ],
    )
    with pytest.raises(tinker.RequestFailedError, match=r"advantages\[0\] is not 0, but the position is a prompt run"):
        tc.forward([bad], "stable_reinforce").result()
    bad.loss_fn_inputs["advantages"] = data[0].loss_fn_inputs["advantages"]
    with pytest.raises(
        tinker.RequestFailedError,
        match=rf"target_tokens\[{len(wrong) - 2}\] is .* but token {len(seq.tokens) - 1} of sequence",
    ):
        tc.forward([bad], "stable_reinforce").result()
    unrecorded = tc.save_weights_and_get_sampling_client().result()  # no record_stability_info
    other = unrecorded.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
    tokens = prompt + other.tokens
    d = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "advantages": np.zeros(len(tokens) - 1, np.float32)},
    ).with_provenance(
        model_input=[SampledProvenanceSpan(sequence_id=other.sequence_id, offset=0, length=len(tokens) - 1)],
        loss_fn_inputs=[SampledProvenanceSpan(sequence_id=other.sequence_id, offset=0, length=len(tokens) - 1)],
    )
    with pytest.raises(tinker.RequestFailedError, match="which this server has no record of for this key"):
        tc.forward([d], "stable_reinforce").result()
