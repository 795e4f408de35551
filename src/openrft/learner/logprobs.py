"""Per-token log-probs and entropy of responses without the ``[tokens, vocabulary]`` logits in memory.

A real vocabulary (151,936 tokens for Qwen2.5/Qwen3) makes the fp32 logits of one 32,768-token response
20 GB, and autograd keeps several copies of them. Here the decoder's last hidden states ``[tokens, hidden]``
are all that is kept: the language-model head runs over chunks of tokens, each chunk's log-sum-exp,
target log-prob and entropy are reduced to three numbers per token, and the gradient is formed chunk by chunk
too (below). Peak memory then grows with the chunk, not with the response.

The gradient is written out by hand (``ChunkedHeadLogp``), with ``z = (h W^T + b) / T`` and ``p = softmax(z)``:

- ``d logp_y / dz = onehot(y) - p``
- ``d H / dz = -p * (log p + H)``, since ``H = logsumexp(z) - sum_i p_i z_i``

When the head is frozen (LoRA) only the hidden states need a gradient, and each token's logits reach the loss
through two numbers, ``logp_y`` and ``H``. The forward pass then keeps, per token, ``d logp_y / dh`` and (when the
entropy bonus trains) ``dH / dh``, each ``[hidden]`` wide, computed from the chunk's softmax while it is in memory;
backward only scales them by the incoming gradients. This drops backward's second pass over the vocabulary (a
third of the head's matmul FLOPs when the entropy does not train). A trainable head keeps the recompute.

A head that is not a plain ``nn.Linear`` (for instance one LoRA wraps) is chunked through activation
checkpointing instead, with autograd's own gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from openrft import onednn
from openrft.attention import runs_chunked_sdpa
from openrft.learner.batch import MicroBatch
from openrft.learner.checkpointing import suspended
from openrft.learner.packed import packed_forward, packed_requested
from openrft.learner.vocab_parallel import VocabParallel
from openrft.prefix_attention import PrefixGroups, share_prefix
from openrft.rollout.kv import cache_keyword, continue_from, freeze, prefill

# Configuration fields after which a causal LM's forward does more than ``lm_head(hidden)`` (soft-capping,
# scaling): such models keep the unchunked path, which runs their own forward.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (LoRA layers are injected in place, so its modules are live)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def can_chunk(model: torch.nn.Module) -> bool:
    """True when the model's logits are its output embedding applied to its decoder's last hidden states."""
    base = unwrap(model)
    config = getattr(base, "config", None)
    if config is None or not hasattr(base, "get_decoder") or base.get_output_embeddings() is None:
        return False
    return all(getattr(config, name, None) in (None, 1.0) for name in LOGIT_TRANSFORMS)


def shared_prefix_forward(model: torch.nn.Module, mb: MicroBatch, hidden: bool = False) -> torch.Tensor:
    """Logits ``[rows, response_width, vocab]`` predicting ``mb.response_ids`` (``hidden``: the decoder's last
    hidden states ``[rows, response_width, hidden]``, before the language-model head).

    Shared prefix: the prompts run once (the LM head on their last position only, which predicts each
    response's first token), their KV cache is gathered onto the response rows and frozen, and the responses
    (all but their last token, which predicts nothing) run on top of it.
    """
    if packed_requested(model, mb):  # a sharded learner's single pass (``learner/packed.py``)
        return packed_forward(model, mb, hidden)
    kwarg = cache_keyword(model)
    with suspended(model):  # the prompts write the cache: never replayed
        first, cache = prefill(model, mb.prompt_ids, mb.prompt_mask, mb.prompt_positions, kwarg, hidden=hidden)
    boundary = _prompt_boundary.get()
    if boundary is not None and torch.is_grad_enabled():
        first = _cut(first, boundary)
        for layer in cache.layers:
            layer.keys, layer.values = _cut(layer.keys, boundary), _cut(layer.values, boundary)
    out = first.index_select(0, mb.prompt_index).unsqueeze(1)
    if mb.response_width > 1:
        ids, positions = mb.response_ids[:, :-1], mb.response_positions[:, :-1]
        own = mb.response_mask[:, :-1]
        shared = None
        if runs_chunked_sdpa(model):
            groups = partial(PrefixGroups.build, mb.prompt_index, mb.prompt_mask, own)
            shared = share_prefix(model.config, cache, groups, ids.shape[1])
        if shared is None:
            cache.batch_select_indices(mb.prompt_index)
        mask = torch.cat([mb.prompt_mask.index_select(0, mb.prompt_index), own.long()], dim=-1)
        with nullcontext() if shared is not None or freeze(cache) else suspended(model):
            rest = continue_from(model, cache, ids, mask, positions, kwarg, hidden)
        if shared is not None:
            shared.check()
        out = torch.cat([out, rest], dim=1)
    return out


_prompt_boundary: ContextVar[list | None] = ContextVar("prompt_boundary", default=None)


@contextmanager
def prompt_boundary() -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Inside, a pass with gradient (``shared_prefix_forward``) runs its responses on detached copies of the
    prompts' outputs (the last position's hidden state or logits, the KV cache); the list collects each
    output and its copy, for ``backward_in_two``."""
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    token = _prompt_boundary.set(pairs)
    try:
        yield pairs
    finally:
        _prompt_boundary.reset(token)


def _cut(tensor: torch.Tensor, pairs: list) -> torch.Tensor:
    if not tensor.requires_grad:
        return tensor
    leaf = tensor.detach().requires_grad_()
    pairs.append((tensor, leaf))
    return leaf


def backward_in_two(
    loss: torch.Tensor, pairs: list[tuple[torch.Tensor, torch.Tensor]], is_last: Callable[[bool], None]
) -> None:
    """``loss.backward()`` over a pass run inside ``prompt_boundary``: the responses' graph, then the prompts'
    from the gradients their copies received (``is_last`` is told which backward is the last). The gradient
    is the one backward makes; but a weight that both graphs use gets its two parts in two backward calls,
    where one call would hold the responses' part until the prompts' backward reached that weight (autograd
    sums a node's inputs before running it). The prompts' outputs always take part in the loss (the first
    response token is predicted from them), so their copies always receive a gradient."""
    is_last(not pairs)
    loss.backward()
    outputs = [(tensor, leaf.grad) for tensor, leaf in pairs if leaf.grad is not None]
    pairs.clear()
    if outputs:
        is_last(True)
        torch.autograd.backward(*zip(*outputs, strict=True))


def chunk_tokens(vocab: int, budget_bytes: int) -> int:
    """Tokens per chunk so that one chunk's fp32 logits take about ``budget_bytes``."""
    return max(1, budget_bytes // (4 * vocab))


class ChunkWorkspace:
    """Buffers of one chunk's ``[tokens, vocabulary]`` fp32 logits, reused by every chunk of a pass.

    A chunk's logits are tens of MB (64 MiB by default): glibc serves each such allocation with a fresh ``mmap``
    whose pages the kernel faults in and zeroes on first touch, about 0.45 s per GiB on this project's machine.
    Allocated per chunk, every chunk of every pass faults its logits and exponentials in again (10 chunks of 50 MB:
    246,040 page faults, tests/core/test_chunked_logprobs.py); here each pass faults in its buffers once."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.rows, self.vocab, self.device = rows, vocab, device
        self.buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, rows: int) -> torch.Tensor:
        """Buffer ``name``'s first ``rows`` rows (its contents are whatever the last chunk left)."""
        if name not in self.buffers:
            self.buffers[name] = torch.empty(self.rows, self.vocab, dtype=torch.float32, device=self.device)
        return self.buffers[name][:rows]


def _scaled_logits(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float,
    work: ChunkWorkspace | None = None,
) -> torch.Tensor:
    packed = onednn.times_transpose(h, weight) if bias is None else None  # a frozen head the learner packed
    if packed is not None:
        z = packed
    elif work is not None and weight.dtype == h.dtype == torch.float32:
        out = work.take("logits", h.shape[0])
        z = torch.mm(h, weight.t(), out=out) if bias is None else torch.addmm(bias, h, weight.t(), out=out)
    else:
        z = torch.nn.functional.linear(h, weight, bias).float()
    return z.mul_(scale) if scale != 1.0 else z


def _chunk_stats(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    scale: float,
    entropy: bool,
    work: ChunkWorkspace | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk's target log-probs and (if ``entropy``) entropies under the scaled fp32 logits, with one
    exponential per logit: ``lse = m + log sum e``, ``H = lse - sum(e z) / sum(e)`` for ``e = exp(z - m)``."""
    z = _scaled_logits(h, weight, bias, scale, work)
    target = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    m = z.amax(dim=-1, keepdim=True)
    if not entropy:
        lse = (m + z.sub_(m).exp_().sum(-1, keepdim=True).log()).squeeze(-1)
        return target - lse, None
    e = (torch.sub(z, m, out=work.take("exp", z.shape[0])) if work is not None else z - m).exp_()
    total = e.sum(-1)
    lse = m.squeeze(-1) + total.log()
    return target - lse, lse - e.mul_(z).sum(-1) / total


def _chunk_with_hidden_gradients(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    scale: float,
    entropy: bool,
    entropy_grad: bool,
    work: ChunkWorkspace,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """One chunk's ``logp``, entropy (if ``entropy``), ``d logp / dh`` and (if ``entropy_grad``) ``dH / dh``."""
    z = _scaled_logits(h, weight, bias, scale, work)
    target = z.gather(-1, targets.unsqueeze(-1))
    m = z.amax(dim=-1, keepdim=True)
    p = torch.sub(z, m, out=work.take("exp", z.shape[0])).exp_()
    total = p.sum(-1, keepdim=True)
    lse = m + total.log()
    logp = (target - lse).squeeze(-1)
    p = p.div_(total)
    ent = d_ent = None
    if entropy:
        plogq = z.sub_(lse).mul_(p)  # p log p, in place of z
        ent = -plogq.sum(-1)
        if entropy_grad:  # dH/dz = -p (log p + H)
            d_ent = _times(plogq.addcmul_(p, ent.unsqueeze(-1)), weight).mul_(-scale)
    ones = torch.ones_like(logp).unsqueeze(-1)
    d_logp = p.neg_().scatter_add_(-1, targets.unsqueeze(-1), ones)  # dlogp/dz = onehot(y) - p, in place of p
    return logp, ent, _times(d_logp, weight).mul_(scale), d_ent


def _times(dz: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``dz @ weight`` in the weight's dtype: on its packed transpose where the learner packed it."""
    packed = onednn.times(dz, weight)
    return packed if packed is not None else dz.to(weight.dtype) @ weight


class ChunkedHeadLogp(torch.autograd.Function):
    """``(logp, entropy)`` per token of ``hidden [N, H]`` under ``linear(hidden, weight, bias) * scale``.

    A frozen head: forward keeps ``d logp / dh`` (and ``dH / dh`` when ``entropy_grad``), backward scales them. A
    trainable head: forward saves only its inputs, and backward recomputes each chunk's logits."""

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        bias,
        targets,
        scale: float,
        chunk: int,
        with_entropy: bool = True,
        entropy_grad: bool = True,
    ):
        ctx.set_materialize_grads(False)
        logp = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros_like(logp)
        work = ChunkWorkspace(min(chunk, hidden.shape[0]), weight.shape[0], hidden.device)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        ctx.gradient_in_forward = need_h and not need_w and not need_b
        ctx.entropy_grad = with_entropy and entropy_grad
        if ctx.gradient_in_forward:
            d_logp = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
            d_ent = torch.empty_like(d_logp) if ctx.entropy_grad else None
            ctx.hidden_dtype = hidden.dtype
        for s in range(0, hidden.shape[0], chunk):
            h, y = hidden[s : s + chunk], targets[s : s + chunk]
            if ctx.gradient_in_forward:
                lp, ent, dl, de = _chunk_with_hidden_gradients(
                    h, weight, bias, y, scale, with_entropy, ctx.entropy_grad, work
                )
                d_logp[s : s + chunk] = dl
                if de is not None:
                    d_ent[s : s + chunk] = de
            else:
                lp, ent = _chunk_stats(h, weight, bias, y, scale, with_entropy, work)
            logp[s : s + chunk] = lp
            if ent is not None:
                entropy[s : s + chunk] = ent
        if ctx.gradient_in_forward:
            ctx.save_for_backward(d_logp, d_ent)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.scale, ctx.chunk = scale, chunk
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        if ctx.gradient_in_forward:
            return _hidden_gradient(ctx, grad_logp, grad_entropy), None, None, None, None, None, None, None
        hidden, weight, bias, targets = ctx.saved_tensors
        scale, chunk = ctx.scale, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        work = ChunkWorkspace(min(chunk, hidden.shape[0]), weight.shape[0], hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            h, y = hidden[s : s + chunk], targets[s : s + chunk]
            z = _scaled_logits(h, weight, bias, scale, work)
            m = z.amax(dim=-1, keepdim=True)
            g_logp = grad_logp[s : s + chunk].float().unsqueeze(-1) if grad_logp is not None else None
            if grad_entropy is not None:  # dH/dz = -p (log p + H); dlogp/dz = onehot(y) - p
                p = torch.sub(z, m, out=work.take("exp", z.shape[0])).exp_()
                total = p.sum(-1, keepdim=True)
                p = p.div_(total)
                logq = z.sub_(m + total.log())  # log p, in place of z
                entropy = -torch.mul(p, logq, out=work.take("product", z.shape[0])).sum(-1, keepdim=True)
                coef = logq.add_(entropy).mul_(grad_entropy[s : s + chunk].float().unsqueeze(-1))
                gz = p.mul_(coef.add_(g_logp) if g_logp is not None else coef).neg_()
            else:
                p = z.sub_(m).exp_()  # in place of z
                gz = p.mul_(-g_logp / p.sum(-1, keepdim=True))
            if g_logp is not None:
                gz.scatter_add_(-1, y.unsqueeze(-1), g_logp)
            if scale != 1.0:
                gz = gz.mul_(scale)
            gz = gz.to(weight.dtype)
            if need_h:
                grad_h[s : s + chunk] = gz @ weight
            if need_w:
                grad_w.addmm_(gz.t().float(), h.float())
            if need_b:
                grad_b += gz.float().sum(0)
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None, None


def _hidden_gradient(ctx, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> torch.Tensor | None:
    """The hidden states' gradient from the per-token gradients ``ChunkedHeadLogp``'s forward kept."""
    d_logp, d_ent = ctx.saved_tensors
    if grad_entropy is not None and not ctx.entropy_grad:
        raise RuntimeError("ChunkedHeadLogp ran with entropy_grad=False, but its entropy received a gradient")
    grad_h = None
    if grad_logp is not None:
        grad_h = d_logp * grad_logp.to(d_logp.dtype).unsqueeze(-1)
    if grad_entropy is not None:
        term = d_ent * grad_entropy.to(d_ent.dtype).unsqueeze(-1)
        grad_h = term if grad_h is None else grad_h.add_(term)
    return grad_h.to(ctx.hidden_dtype) if grad_h is not None else None


def _generic_chunk(head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, scale: float):
    z = head(h).float() * scale
    logq = torch.log_softmax(z, dim=-1)
    return logq.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logq.exp() * logq).sum(-1)


def head_logp_entropy(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``targets`` and entropies ``[...]`` (the shape of ``targets``) under
    ``head(hidden) / temperature`` (temperature 0 is read as 1), ``chunk`` tokens at a time. Without
    ``with_entropy`` the entropies may be left zero (one pass over the logits fewer); without ``entropy_grad``
    the entropies must not take part in a loss (a frozen head then skips their gradient)."""
    scale = 1.0 / temperature if temperature > 0 else 1.0
    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    vocab_parallel = VocabParallel.of(head)  # a sharded learner's head (learner/vocab_parallel.py)
    if vocab_parallel is not None:
        logp, entropy = vocab_parallel.logp_entropy(flat_h, flat_t, scale, chunk)
    elif type(head) is torch.nn.Linear:
        args = (flat_h, head.weight, head.bias, flat_t, scale, chunk, with_entropy, entropy_grad)
        logp, entropy = ChunkedHeadLogp.apply(*args)
    else:  # a wrapped head (LoRA on lm_head): autograd's gradient, each chunk recomputed in backward
        parts = []
        for s in range(0, flat_h.shape[0], chunk):
            args = (head, flat_h[s : s + chunk], flat_t[s : s + chunk], scale)
            grad = torch.is_grad_enabled()
            parts.append(checkpoint(_generic_chunk, *args, use_reentrant=False) if grad else _generic_chunk(*args))
        logp, entropy = (torch.cat(x) for x in zip(*parts, strict=True))
    return logp.view(targets.shape), entropy.view(targets.shape)


def chunked_logp_entropy(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float,
    chunk: int,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of ``mb.targets`` and entropies ``[rows, response_width]`` under ``model``, chunked
    (``head_logp_entropy``)."""
    hidden = shared_prefix_forward(model, mb, hidden=True)
    head = unwrap(model).get_output_embeddings()
    return head_logp_entropy(hidden, head, mb.targets, temperature, chunk, with_entropy, entropy_grad)
