"""The official ``tinker`` SDK against a real ``openrft serve`` on 127.0.0.1 (the demo model, seconds).

Every loss is checked against the formula computed here in numpy from the learner's own log-probs;
sampling log-probs against the learner's; save/load, tenants and bad inputs through the SDK's calls.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from openrft.service.store import Store  # noqa: E402
from tests.service.svc_helpers import CLI, Service  # noqa: E402

MODEL = "openrft-demo"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    os.environ["TINKER_TELEMETRY"] = "0"
    root = tmp_path_factory.mktemp("tinker")
    service = Service(root, f"sqlite:///{root / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
    # the first key as a user makes it: `openrft keys create --tinker` prints it ready for the SDK
    where = [f"--data-dir={root}", f"--database-url={service.database_url}"]
    printed = subprocess.run(
        [sys.executable, "-c", CLI, "keys", "create", "--tinker", "--name", "a", *where],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    assert printed.startswith("tml-"), printed
    store = Store.open(service.database_url)  # the second as `openrft keys create` makes it, without its process
    keys = (printed, "tml-" + store.create_key("b")[1])
    store.close()
    service.wait_healthy(service.serve(workers=0, wait=False), timeout=400)  # a loaded CI machine starts slowly
    yield service, keys
    service.stop_all()


@pytest.fixture(scope="module")
def client(server):
    service, (key, _) = server
    return tinker.ServiceClient(base_url=service.base_url, api_key=key)


@pytest.fixture(scope="module")
def tokenizer(client):
    return trainer(client).get_tokenizer()


def trainer(client, seed: int = 0):
    return client.create_lora_training_client(base_model=MODEL, rank=4, seed=seed).result()


def sequence(tokenizer, text: str = "What is 12+30? 42") -> list[int]:
    return tokenizer.encode(text)


def datum(tokens: list[int], **inputs) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def learner_logprobs(tc, tokens: list[int]) -> np.ndarray:
    n = len(tokens) - 1
    out = tc.forward([datum(tokens, target_tokens=tokens[1:], weights=np.ones(n, np.float32))], "cross_entropy")
    return out.result().loss_fn_outputs[0]["logprobs"].to_numpy()


def test_the_losses_are_the_documented_sums(client, tokenizer):
    tc = trainer(client)
    tokens = sequence(tokenizer)
    n = len(tokens) - 1
    lp = learner_logprobs(tc, tokens).astype(np.float64)
    rng = np.random.default_rng(0)
    q = lp + rng.uniform(-0.5, 0.5, n)  # ratios from 0.6 to 1.65: both clip bounds bite
    adv = rng.normal(size=n)
    weights = (rng.random(n) > 0.4).astype(np.float64) * 0.5
    ratio = np.exp(lp - q)
    expected = {
        ("cross_entropy", None): -(lp * weights).sum(),
        ("importance_sampling", None): -(ratio * adv).sum(),
        ("ppo", None): -np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv).sum(),
        ("ppo", (0.9, 1.1)): -np.minimum(ratio * adv, np.clip(ratio, 0.9, 1.1) * adv).sum(),
        ("cispo", None): -(np.clip(ratio, 0.0, 4.0) * lp * adv).sum(),
        ("cispo", (0.9, 1.1)): -(np.clip(ratio, 0.9, 1.1) * lp * adv).sum(),
        ("dro", None): -(lp * adv - 0.05 * (lp - q) ** 2).sum(),
        ("dro", 0.5): -(lp * adv - 0.25 * (lp - q) ** 2).sum(),
    }
    assert abs(np.clip(ratio, 0.8, 1.2) - ratio).max() > 0.1
    for (loss, setting), value in expected.items():
        if loss == "cross_entropy":
            d = datum(tokens, target_tokens=tokens[1:], weights=weights.astype(np.float32))
        else:
            d = datum(
                tokens, target_tokens=tokens[1:], logprobs=q.astype(np.float32), advantages=adv.astype(np.float32)
            )
        config = None
        if isinstance(setting, tuple):
            config = {"clip_low_threshold": setting[0], "clip_high_threshold": setting[1]}
        elif setting is not None:
            config = {"beta": setting}
        out = tc.forward([d], loss, loss_fn_config=config).result()
        assert out.metrics["loss:sum"] == pytest.approx(value, rel=1e-4, abs=1e-4), (loss, setting)


def test_position_i_predicts_token_i_plus_one(client, tokenizer):
    """forward's logprobs[i] is the sampler's prompt log-prob of token i + 1 (computed by another path)."""
    tc = trainer(client)
    tokens = sequence(tokenizer)
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt_lp = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    assert prompt_lp[0] is None
    np.testing.assert_allclose(learner_logprobs(tc, tokens), prompt_lp[1:], atol=1e-4)


def test_sampled_logprobs_are_the_learners(client, tokenizer):
    tc = trainer(client)
    tokens = sequence(tokenizer)
    step = tc.forward_backward(
        [datum(tokens, target_tokens=tokens[1:], weights=np.ones(len(tokens) - 1, np.float32))], "cross_entropy"
    )
    tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    step.result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = tokens[:9]
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    result = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result()
    again = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result()
    assert [s.tokens for s in result.sequences] == [s.tokens for s in again.sequences]  # the seed
    for seq in result.sequences:
        assert len(seq.tokens) == len(seq.logprobs) <= 6
        full = prompt + seq.tokens
        learner = learner_logprobs(tc, full)[len(prompt) - 1 :]
        np.testing.assert_allclose(seq.logprobs, learner, atol=1e-4)


def test_concurrent_samples_run_as_one_batch_with_the_learners_logprobs(client, tokenizer):
    tc = trainer(client)
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompts = [sequence(tokenizer, text)[:-1] for text in ("What is 1+2? 3", "What is 10-7? 3", "What is 45+45? 90")]
    params = types.SamplingParams(max_tokens=5)
    futures = [sampler.sample(types.ModelInput.from_ints(p), 2, params) for p in prompts]  # queued together
    for prompt, future in zip(prompts, futures):
        for seq in future.result().sequences:
            learner = learner_logprobs(tc, prompt + seq.tokens)[len(prompt) - 1 :]
            np.testing.assert_allclose(seq.logprobs, learner, atol=1e-4)


def test_stop_and_limits(client, tokenizer):
    sampler = client.create_sampling_client(base_model=MODEL).result()
    prompt = types.ModelInput.from_ints(sequence(tokenizer, "What is 2+2?"))
    eos = tokenizer.eos_token_id
    free = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=12, stop=[], seed=0)).result()
    assert all(len(s.tokens) == 12 and s.stop_reason == "length" for s in free.sequences)
    ended = sampler.sample(prompt, 3, types.SamplingParams(max_tokens=12, seed=0)).result()
    for seq in ended.sequences:
        assert seq.stop_reason == "length" or (seq.tokens[-1] == eos and eos not in seq.tokens[:-1])
    digit = tokenizer.encode("1")[0]
    cut = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=12, stop=[digit], seed=0, top_k=5)).result()
    for seq in cut.sequences:
        assert digit not in seq.tokens[:-1]
    greedy = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=5, temperature=0.0)).result()
    assert greedy.sequences[0].tokens == greedy.sequences[1].tokens


def test_gradients_accumulate_until_optim_step_and_adam_is_adamw(server, client, tokenizer):
    service, _ = server
    one, two = trainer(client, seed=7), trainer(client, seed=7)
    a, b = sequence(tokenizer, "What is 1+1? 2"), sequence(tokenizer, "What is 9-4? 5")
    da = datum(a, target_tokens=a[1:], weights=np.ones(len(a) - 1, np.float32))
    db = datum(b, target_tokens=b[1:], weights=np.ones(len(b) - 1, np.float32))
    adam = types.AdamParams(learning_rate=0.01, beta1=0.9, beta2=0.95, eps=1e-12)
    one.forward_backward([da, db], "cross_entropy").result()
    one.optim_step(adam).result()
    two.forward_backward([da], "cross_entropy").result()
    two.forward_backward([db], "cross_entropy").result()
    two.optim_step(adam).result()
    np.testing.assert_allclose(learner_logprobs(one, a), learner_logprobs(two, a), atol=1e-5)
    # AdamW's first step from zero moments moves each weight by lr * g / |g|: LoRA's B starts at 0
    path = one.save_state("first-step").result().path
    run, _, name = path[len("tinker://") :].split("/")
    state = torch.load(service.data_dir / "tinker" / run / "weights" / name / "state.pt", weights_only=True)
    b_weights = torch.cat([v.flatten() for k, v in state["adapter"].items() if "lora_B" in k])
    moved = b_weights[b_weights != 0].abs()
    assert moved.numel() > 0.9 * b_weights.numel()
    torch.testing.assert_close(moved, torch.full_like(moved, 0.01), rtol=1e-3, atol=1e-6)


def test_save_and_load_state_round_trip_with_the_optimizer(client, tokenizer):
    tokens = sequence(tokenizer)
    d = datum(tokens, target_tokens=tokens[1:], weights=np.ones(len(tokens) - 1, np.float32))
    adam = types.AdamParams(learning_rate=0.02)
    tc = trainer(client, seed=1)
    for _ in range(2):
        tc.forward_backward([d], "cross_entropy").result()
        tc.optim_step(adam).result()
    path = tc.save_state("two-steps").result().path
    before = learner_logprobs(tc, tokens)
    restored = client.create_training_client_from_state_with_optimizer(path).result()
    weights_only = client.create_training_client_from_state(path).result()
    np.testing.assert_array_equal(learner_logprobs(restored, tokens), before)
    np.testing.assert_array_equal(learner_logprobs(weights_only, tokens), before)
    for c in (tc, restored, weights_only):
        c.forward_backward([d], "cross_entropy").result()
        c.optim_step(adam).result()
    np.testing.assert_array_equal(learner_logprobs(restored, tokens), learner_logprobs(tc, tokens))
    # without the optimizer's moments the third step is a different one
    assert np.abs(learner_logprobs(weights_only, tokens) - learner_logprobs(tc, tokens)).max() > 1e-4
    listed = tinker.RestClient(base_url=client._base_url, api_key=client._api_key).list_checkpoints(tc.model_id)
    assert [c.tinker_path for c in listed.result().checkpoints] == [path]


def test_two_tenants_are_isolated(server, client, tokenizer):
    service, (_, other_key) = server
    tc = trainer(client)
    path = tc.save_state("mine").result().path
    other = tinker.ServiceClient(base_url=service.base_url, api_key=other_key)
    with pytest.raises(Exception, match="no checkpoint"):
        other.create_sampling_client(model_path=path).result()
    with pytest.raises(Exception, match="no checkpoint"):
        other.create_training_client_from_state(path).result()
    info = httpx.post(
        service.base_url + "/api/v1/get_info", json={"model_id": tc.model_id}, headers={"X-API-Key": other_key}
    )
    assert info.status_code == 404 and "no training model" in info.json()["detail"]
    with pytest.raises(tinker.NotFoundError, match="no training run"):
        tinker.RestClient(base_url=service.base_url, api_key=other_key).list_checkpoints(tc.model_id).result()
    bad = httpx.post(
        service.base_url + "/api/v1/get_info", json={"model_id": tc.model_id}, headers={"X-API-Key": "tml-x"}
    )
    assert bad.status_code == 401
    # another tenant's futures read as not found too
    headers = {"X-API-Key": client._api_key}
    mine = httpx.post(service.base_url + "/api/v1/save_weights", json={"model_id": tc.model_id}, headers=headers)
    request_id = mine.json()["request_id"]
    theirs = {"X-API-Key": other_key}
    peek = httpx.post(service.base_url + "/api/v1/retrieve_future", json={"request_id": request_id}, headers=theirs)
    assert peek.status_code == 404 and "no request" in peek.json()["detail"]


def test_bad_inputs_get_the_apis_errors_and_leave_nothing_behind(client, tokenizer):
    tc = trainer(client)
    tokens = sequence(tokenizer)
    n = len(tokens) - 1
    before = learner_logprobs(tc, tokens)
    short = datum(tokens, target_tokens=tokens[1:], weights=np.ones(n - 2, np.float32))
    with pytest.raises(tinker.RequestFailedError, match=rf"weights has shape \[{n - 2}\]; it must be \[{n}\]"):
        tc.forward_backward([short], "cross_entropy").result()
    good = datum(tokens, target_tokens=tokens[1:], weights=np.ones(n, np.float32))
    with pytest.raises(tinker.RequestFailedError, match="loss_fn 'dppo' is not supported"):
        tc.forward_backward([good], "dppo").result()
    with pytest.raises(tinker.RequestFailedError, match="clip_lo"):
        tc.forward_backward([good], "ppo", loss_fn_config={"clip_lo": 0.5}).result()
    tc.optim_step(types.AdamParams(learning_rate=0.1)).result()  # no gradient was left behind to step on
    np.testing.assert_array_equal(learner_logprobs(tc, tokens), before)

    def jobs() -> list[str]:
        bearer = {"Authorization": "Bearer " + client._api_key.removeprefix("tml-")}
        return [j["id"] for j in httpx.get(client._base_url + "/v1/dashboard/jobs", headers=bearer).json()["data"]]

    before = jobs()
    with pytest.raises(tinker.BadRequestError, match=r"no-such-model.*is not a model this server publishes"):
        client.create_lora_training_client(base_model="no-such-org/no-such-model", rank=4).result()
    assert jobs() == before  # no training client, no job row


def test_forward_backward_custom_takes_the_same_step_as_the_builtin_loss(client, tokenizer):
    tokens = sequence(tokenizer)
    weights = np.linspace(0.2, 1.0, len(tokens) - 1).astype(np.float32)
    d = datum(tokens, target_tokens=tokens[1:], weights=weights)
    builtin, custom = trainer(client, seed=3), trainer(client, seed=3)
    adam = types.AdamParams(learning_rate=0.02)
    builtin.forward_backward([d], "cross_entropy").result()
    builtin.optim_step(adam).result()

    def loss(data, logprobs):
        total = -(logprobs[0] * torch.tensor(weights)).sum()
        return total, {"custom": float(total.detach())}

    out = custom.forward_backward_custom([d], loss).result()
    custom.optim_step(adam).result()
    assert "custom" in out.metrics
    np.testing.assert_allclose(learner_logprobs(custom, tokens), learner_logprobs(builtin, tokens), atol=1e-5)


def test_a_model_keeps_only_its_newest_snapshot_samplers(client, tokenizer):
    from openrft.service.tinker.engine import KEEP_SNAPSHOTS

    tc = trainer(client)
    prompt = types.ModelInput.from_ints(sequence(tokenizer)[:8])
    params = types.SamplingParams(max_tokens=2)
    samplers = [tc.save_weights_and_get_sampling_client().result() for _ in range(KEEP_SNAPSHOTS + 1)]
    assert len(samplers[-1].sample(prompt, 1, params).result().sequences) == 1
    assert len(samplers[1].sample(prompt, 1, params).result().sequences) == 1
    with pytest.raises(tinker.NotFoundError, match="no sampling session"):
        samplers[0].sample(prompt, 1, params).result()
