"""Long sequences: attention over chunks of query rows (attention.py) and activation checkpointing with the
shared prompt cache (learner/checkpointing.py) give the learner's log-probs and gradients unchanged."""

import torch
from transformers import Qwen2ForCausalLM

import openrft.attention as attention
import openrft.prefix_attention as prefix_attention
from openrft.learner.batch import TrainSample, collate
from openrft.learner.checkpointing import enable_activation_checkpointing
from openrft.learner.learner import response_logits, token_logp
from openrft.rollout.kv import freeze, prefill
from tests.core.test_sharded import relative_update_error
from tests.tiny_models import tiny_qwen2


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return tiny_qwen2(64, 128, attention_dropout=0.0)


def _batch():
    g = torch.Generator().manual_seed(2)
    samples = []
    for p, n in ((5, 3), (2, 2), (9, 2)):  # prompts of different lengths: left padding in the prompt mask
        prompt = torch.randint(1, 64, (p,), generator=g).tolist()
        for k in range(n):
            samples.append(TrainSample(prompt, torch.randint(1, 64, (3 + 7 * k + p,), generator=g).tolist(), 1.0))
    return collate(samples, 0, torch.device("cpu"))


def _logp_and_grads(model, mb):
    weights = torch.randn(mb.response_ids.shape, generator=torch.Generator().manual_seed(3))
    model.zero_grad()
    logp = token_logp(response_logits(model, mb, 0.8), mb.targets)
    (logp * weights * mb.response_mask).sum().backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


def _close(got, want, rtol=1e-5):
    a, b = torch.cat([g.flatten() for g in got]), torch.cat([w.flatten() for w in want])
    return float((a - b).norm() / b.norm()) <= rtol


def test_chunked_attention_matches_sdpa_with_padding_and_a_cached_prefix(monkeypatch):
    mb = _batch()
    model = _model()
    want_logp, want_grads = _logp_and_grads(model, mb)

    monkeypatch.setattr(attention, "MASK_ELEMENTS", 40)  # a few query rows per chunk
    monkeypatch.setattr(prefix_attention, "MEMORY_RATIO", 0.0)  # the gathered cache, as for long responses
    assert attention.use_chunked_sdpa(model) and model.config._attn_implementation == attention.ATTENTION
    calls = []
    monkeypatch.setattr(attention, "_attend", lambda *a, _f=attention._attend: calls.append(a[1]) or _f(*a))
    logp, grads = _logp_and_grads(model, mb)
    assert len(set(calls)) > 3  # the responses' queries ran in several chunks
    mask = mb.response_mask.bool()
    assert torch.allclose(logp[mask], want_logp[mask], rtol=1e-5, atol=1e-6)
    assert _close(grads, want_grads)


def test_chunked_attention_is_sdpa_itself_for_short_sequences(monkeypatch):
    monkeypatch.setattr(prefix_attention, "MEMORY_RATIO", 0.0)  # the gathered cache (test_prefix_attention.py)
    model = _model()
    mb = _batch()
    want = response_logits(model, mb, 1.0)
    attention.use_chunked_sdpa(model)
    assert torch.equal(response_logits(model, mb, 1.0), want)


def test_activation_checkpointing_recomputes_layers_and_keeps_the_gradient():
    mb = _batch()
    model = _model().train()
    want_logp, want_grads = _logp_and_grads(model, mb)

    assert enable_activation_checkpointing(model) == 2
    runs = []
    model.model.layers[0].input_layernorm.register_forward_pre_hook(lambda *_: runs.append(1))
    logp, grads = _logp_and_grads(model, mb)
    assert len(runs) == 3  # the prompts once (not checkpointed), the responses twice (forward, then backward)
    assert torch.equal(logp, want_logp)
    assert _close(grads, want_grads)


def test_a_frozen_cache_is_read_not_written():
    model = _model()
    ids = torch.tensor([[1, 2, 3]])
    _, cache = prefill(model, ids, torch.ones_like(ids), torch.arange(3)[None], "cache")
    assert freeze(cache)
    keys, _ = cache.layers[0].update(torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4))
    assert keys.shape[-2] == 7 and cache.get_seq_length() == 3


def test_the_job_option_turns_checkpointing_on_in_the_learner(recipe_factory):
    import yaml

    from openrft.engine.local_runtime import learner_config
    from openrft.learner import Learner, Policy
    from openrft.learner.logprobs import unwrap
    from openrft.models import load_causal_lm
    from openrft.spec.dialects import load_job

    path = recipe_factory()
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"]["activation_checkpointing"] = True
    path.write_text(yaml.safe_dump(recipe))
    spec = load_job(path)
    assert spec.training.activation_checkpointing
    policy = Policy(load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32), spec.lora, need_reference=True)
    learner = Learner(policy, learner_config(spec, 0))
    layers = unwrap(learner.model).model.layers
    assert all(layer.gradient_checkpointing for layer in layers)
    runs = []
    layers[0].input_layernorm.register_forward_pre_hook(lambda *_: runs.append(1))
    samples = [TrainSample([5, 6, 7], [8, 9, 10, 11], 1.0), TrainSample([5, 6, 7], [12, 13], -1.0)]
    learner.accumulate(samples, 6)
    assert all(p.grad is not None for p in learner.policy.trainable_parameters())
    # the model loads in eval mode: the learner trains it in train mode, where the layers are checkpointed: the
    # reference's prompt and responses once each (no gradient), the policy's prompt once, its responses twice
    # (forward, then backward)
    assert spec.algorithm.kl_loss_coef > 0
    assert all(m.training for m in learner.model.modules()) and len(runs) == 2 + 1 + 2


def test_a_group_with_one_long_response_is_split_around_it():
    from openrft.learner.batch import padded_cost, plan_micro_batches

    prompt = list(range(1, 33))
    lengths = [100, 32_768, 90, 4_000, 120, 4_100, 80, 110]
    samples = [TrainSample(prompt, [7] * n, 1.0) for n in lengths]
    plan = plan_micro_batches(samples, 8_192)
    assert sorted(i for mb in plan for i in mb) == list(range(len(samples)))
    assert [1] in plan  # the 32,768-token response alone: it cannot share, nor be cut
    for mb in plan:
        cost = padded_cost([len(prompt)], [lengths[i] for i in mb])
        assert mb == [1] or cost <= 8_192, (mb, cost)
    # the short ones share one micro-batch, not padded to the long ones' width
    assert sorted(next(mb for mb in plan if 0 in mb)) == [0, 2, 4, 6, 7]


def test_the_sharded_learner_takes_the_chunked_head():
    """FSDP2 needs every pass to enter through the root module: the chunked head's hidden states are taken
    by a hook during the model's own forward. One gloo rank makes the plain learner's update."""
    import torch.distributed as dist

    from openrft.learner import Learner, Policy
    from openrft.learner.learner import LearnerConfig
    from openrft.learner.sharded import ShardedLearner, ShardedPolicy
    from openrft.runtime.process_group import free_port
    from openrft.spec.job import AlgorithmSpec, LoraSpec, OptimizerSpec

    def config(lora):
        algorithm, optimizer = AlgorithmSpec(kl_loss_coef=0.05, ent_coeff=0.01), OptimizerSpec(lr=1e-2, adam_eps=1e-3)
        return LearnerConfig(algorithm, optimizer, lora, 0.7, 30, pad_token_id=0, logits_chunk_bytes=16)

    g = torch.Generator().manual_seed(1)
    responses = [torch.randint(1, 64, (9 + k,), generator=g).tolist() for k in range(3)]
    samples = [TrainSample([1, 2, 3, 4], response, k - 1.0) for k, response in enumerate(responses)]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        for lora in (LoraSpec(), LoraSpec(enabled=False)):
            plain = Learner(Policy(_model(), lora, need_reference=True), config(lora))
            assert plain.head_chunk(plain.model, collate(samples, 0, torch.device("cpu"))) == 1
            before = {k: v.clone() for k, v in plain.model.state_dict().items()}
            plain.step(samples)
            sharded = ShardedLearner(ShardedPolicy(_model(), lora, True, torch.device("cpu")), config(lora))
            sharded.step(samples)
            with sharded.policy.gathered():
                got = {k: getattr(v, "full_tensor", lambda v=v: v)() for k, v in sharded.model.state_dict().items()}
            # float32: the sharded learner sums a pass's gradient in two backward calls (1e-6 of the update)
            assert relative_update_error(before, plain.model.state_dict(), got) <= 1e-5
    finally:
        dist.destroy_process_group()
