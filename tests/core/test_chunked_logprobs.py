"""The LM head chunked over tokens (learner/logprobs.py): the same log-probs, entropies and gradients as the full
fp32 logits, through the hand-written backward and through the learner, with LoRA, tied embeddings, the entropy
bonus and the KL term."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2ForCausalLM

from openrft.algo.loss import entropy_from_logits
from openrft.learner import Learner, Policy
from openrft.learner.batch import collate
from openrft.learner.learner import LearnerConfig, token_logp
from openrft.learner.logprobs import ChunkedHeadLogp, head_logp_entropy, unwrap
from openrft.spec.job import AlgorithmSpec, LoraSpec, OptimizerSpec
from tests.tiny_models import grouped_samples, tiny_qwen2

VOCAB = 300


def _relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    a, b = torch.cat([g.flatten() for g in got]), torch.cat([w.flatten() for w in want])
    assert b.norm() > 0
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("frozen", [False, True], ids=["trainable-head", "frozen-head"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [0.7, 0.0])
@pytest.mark.parametrize("grads", ["logp", "entropy", "both"])
def test_function_matches_autograd_on_full_logits(frozen, bias, temperature, grads):
    """A trainable head's gradient comes from backward's recompute, a frozen head's from the per-token gradients
    forward kept: both equal autograd's through the full logits."""
    torch.manual_seed(0)
    n, h = 23, 8
    head = torch.nn.Linear(h, VOCAB, bias=bias).requires_grad_(not frozen)
    hidden = torch.randn(n, h, requires_grad=True)
    targets = torch.randint(0, VOCAB, (n,))
    g_logp, g_ent = torch.randn(n), torch.randn(n)

    def objective(logp, entropy):
        return (logp * g_logp if grads != "entropy" else 0) + (entropy * g_ent if grads != "logp" else 0)

    scale = 1 / temperature if temperature > 0 else 1.0
    logits = head(hidden) * scale
    want_logp, want_ent = token_logp(logits, targets), entropy_from_logits(logits)
    objective(want_logp, want_ent).sum().backward()
    params = [] if frozen else [head.weight] + ([head.bias] if bias else [])
    want = [hidden.grad.clone()] + [param.grad.clone() for param in params]
    for tensor in [hidden, *params]:
        tensor.grad = None

    logp, ent = head_logp_entropy(hidden, head, targets, temperature, chunk=5)  # 5 chunks, the last one short
    assert torch.allclose(logp, want_logp, rtol=1e-5, atol=1e-6)
    assert torch.allclose(ent, want_ent, rtol=1e-5, atol=1e-6)
    assert "ChunkedHeadLogp" in logp.grad_fn.next_functions[0][0].name()
    objective(logp, ent).sum().backward()
    got = [hidden.grad] + [param.grad for param in params]
    assert _relative_error(got, want) <= 1e-5


class _MatmulCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_a_frozen_head_runs_no_matmul_in_backward(entropy_grad):
    """A frozen head's forward computes the hidden states' gradient basis (one matmul over the vocabulary per
    chunk for ``d logp / dh``, one more for ``dH / dh`` when the entropy trains); backward runs none, where the
    recompute would run two per chunk (the logits again, and their gradient times the head)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, VOCAB, bias=False).requires_grad_(False)
    hidden = torch.randn(12, 8, requires_grad=True)
    targets = torch.randint(0, VOCAB, (12,))
    with _MatmulCount() as forward:
        logp, ent = head_logp_entropy(hidden, head, targets, 1.0, chunk=4, entropy_grad=entropy_grad)
    assert forward.calls == 3 * (3 if entropy_grad else 2)  # 3 chunks: logits, d logp / dh (, dH / dh)
    loss = logp.sum() + (ent.sum() if entropy_grad else 0)
    with _MatmulCount() as backward:
        loss.backward()
    assert backward.calls == 0
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()


def test_an_entropy_without_gradient_refuses_one():
    head = torch.nn.Linear(8, VOCAB, bias=False).requires_grad_(False)
    hidden = torch.randn(6, 8, requires_grad=True)
    logp, ent = head_logp_entropy(hidden, head, torch.randint(0, VOCAB, (6,)), 1.0, chunk=4, entropy_grad=False)
    with pytest.raises(RuntimeError, match="entropy_grad=False"):
        (logp.sum() + ent.sum()).backward()


def test_frozen_head_gets_no_gradient_and_no_grad_mode_saves_nothing():
    head = torch.nn.Linear(4, VOCAB).requires_grad_(False)
    hidden = torch.randn(6, 4, requires_grad=True)
    targets = torch.randint(0, VOCAB, (6,))
    logp, _ = ChunkedHeadLogp.apply(hidden, head.weight, head.bias, targets, 1.0, 4)
    logp.sum().backward()
    assert hidden.grad is not None and head.weight.grad is None
    with torch.no_grad():
        logp, _ = head_logp_entropy(hidden, head, targets, 1.0, chunk=4)
    assert logp.grad_fn is None


def _model(tied: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return tiny_qwen2(VOCAB, 128, tie_word_embeddings=tied)


def _learner(lora: LoraSpec, tied: bool, ent_coeff: float, kl: float) -> Learner:
    policy = Policy(_model(tied), lora, need_reference=kl > 0)
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA starts at B = 0, the policy equal to the reference: move it off
        for param in policy.trainable_parameters():
            param.add_(torch.randn_like(param) * 0.05)
    algorithm = AlgorithmSpec(ent_coeff=ent_coeff, kl_loss_coef=kl)
    config = LearnerConfig(algorithm, OptimizerSpec(), lora, temperature=0.7, micro_batch_tokens=60, pad_token_id=0)
    return Learner(policy, config)


@pytest.mark.parametrize(
    ("lora", "tied"),
    [
        (LoraSpec(), False),
        (LoraSpec(), True),
        (LoraSpec(enabled=False), True),  # full fine-tuning: the head's gradient adds to the embedding's
        (LoraSpec(target_modules=["q_proj", "v_proj", "lm_head"]), False),  # a LoRA-wrapped head
    ],
    ids=["lora", "lora-tied", "full-tied", "lora-on-head"],
)
@pytest.mark.parametrize(("ent_coeff", "kl"), [(0.0, 0.0), (0.01, 0.0), (0.0, 0.05), (0.01, 0.05)])
def test_learner_gradient_equals_the_unchunked_one(lora, tied, ent_coeff, kl):
    learner = _learner(lora, tied, ent_coeff, kl)
    samples = grouped_samples(VOCAB)
    total = sum(len(s.response_ids) for s in samples)

    learner.config.logits_chunk_bytes = 2**40  # every micro-batch's logits fit: the full logits
    unchunked_sums = learner.accumulate(samples, total)
    want = learner.gradients()
    learner.optimizer.zero_grad(set_to_none=True)

    learner.config.logits_chunk_bytes = 4 * VOCAB * 3  # 3 tokens per chunk
    mb = collate([samples[i] for i in learner.plan(samples)[0]], 0, torch.device("cpu"))
    assert learner.head_chunk(learner.model, mb) == 3
    chunked_sums = learner.accumulate(samples, total)
    assert _relative_error(learner.gradients(), want) <= 1e-5
    for key in ("pg_loss", "kl", "entropy"):
        assert chunked_sums[key] == pytest.approx(unchunked_sums[key], rel=1e-5, abs=1e-7)


def test_all_linear_lora_leaves_the_head_a_plain_linear():
    policy = Policy(_model(tied=False), LoraSpec(), need_reference=False)
    assert type(unwrap(policy.model).get_output_embeddings()) is torch.nn.Linear


@pytest.mark.parametrize("trainable_head", [False, True], ids=["frozen-head", "trainable-head"])
def test_chunks_reuse_one_set_of_logits_buffers(trainable_head):
    """Each chunk's logits and exponentials go into buffers the pass allocated once: 10 chunks of 50 MB logits
    (above glibc's largest mmap threshold, so a fresh allocation would be fresh pages each time) fault in about
    one chunk's worth of pages in forward and in backward, not ten."""
    import resource

    torch.manual_seed(0)
    vocab, chunk, chunks = 2**16, 192, 10
    weight = (torch.randn(vocab, 8) * 0.1).requires_grad_(trainable_head)
    hidden = torch.randn(chunk * chunks, 8, requires_grad=True)
    targets = torch.randint(0, vocab, (chunk * chunks,))
    pages_per_chunk = chunk * vocab * 4 // resource.getpagesize()

    def faults(run) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        run()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    outputs = []
    forward = faults(lambda: outputs.extend(ChunkedHeadLogp.apply(hidden, weight, None, targets, 1.0, chunk, True)))
    logp, entropy = outputs
    backward = faults(lambda: (logp.sum() + entropy.sum()).backward())
    assert forward < 3 * pages_per_chunk, (forward, pages_per_chunk)  # logits and exponentials, once each
    # a trainable head's recompute: logits, exponentials and their product; a frozen head's backward: none
    assert backward < (4 if trainable_head else 1) * pages_per_chunk, (backward, pages_per_chunk)
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()
