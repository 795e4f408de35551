"""The input embedding and the LM head of a sharded learner, split over the ranks by vocabulary rows.

A model's embedding matrix (``[vocabulary, hidden]``, tied to the LM head in Qwen2.5-0.5B and most small
models) is its largest tensor: 136M of Qwen2.5-0.5B's 494M parameters. As one FSDP unit it would be
gathered whole for every pass, from the embedding lookup at the start of the forward to the end of the
backward, with its whole gradient beside it (measured: most of a sharded step's memory, docs/scaling.md).
Here it is never gathered: each rank keeps its rows (a ``DTensor`` sharded on dimension 0, as FSDP
shards, so checkpoints, clipping and AdamW see it like any other shard) and the ranks compute together:

- embedding: every rank's token ids are gathered, each rank looks up the ids in its rows (zeros for the
  others') and a reduce-scatter sums each rank's own tokens' embeddings; backward gathers the
  embeddings' gradients and adds them into the rows (Megatron's vocabulary-parallel embedding, over the
  data-parallel ranks' tokens);
- LM head, full logits: every rank's hidden states are gathered, each rank computes the logits of its
  rows and an all-to-all gives each rank its tokens' logits over the whole vocabulary;
- LM head, chunked log-probs and entropy (``learner/logprobs.py``): each rank reduces its rows' logits
  to a maximum, a sum of exponentials, the target's logit and a sum of ``e * z`` per token; combining the
  ranks' numbers gives the log-softmax and entropy, and backward forms each rank's rows' gradient from
  the global log-sum-exp (vocabulary-parallel cross-entropy).

Every rank runs the same collectives in the same order, as FSDP's do: the learner gives every rank the
same number of passes (zero-weight padding passes). The embedding lookup of a pass without gradient,
and generation, which rank 0 runs alone, use ``whole`` (the matrix gathered, a plain module again).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor


def rows_of(vocab: int, rank: int, world: int) -> tuple[int, int]:
    """The first row and the number of rows of ``rank``'s shard (``torch.chunk``'s split, DTensor's ``Shard(0)``)."""
    size = -(-vocab // world)
    start = min(rank * size, vocab)
    return start, max(0, min(size, vocab - start))


def _gather_rows(local: torch.Tensor, group) -> tuple[torch.Tensor, list[int]]:
    """Every rank's ``local`` rows ``[n_r, ...]`` stacked ``[world * most, ...]`` (padded to the most);
    the counts."""
    world = dist.get_world_size(group)
    count = torch.tensor([local.shape[0]], dtype=torch.int64, device=local.device)
    counts = torch.empty(world, dtype=torch.int64, device=local.device)
    dist.all_gather_into_tensor(counts, count, group=group)
    counts_list = counts.tolist()
    most = max(counts_list)
    padded = local.new_zeros((most, *local.shape[1:]))
    padded[: local.shape[0]] = local
    out = local.new_empty((world * most, *local.shape[1:]))
    dist.all_gather_into_tensor(out, padded.contiguous(), group=group)
    return out, counts_list


def _add_into(sink: torch.Tensor, part: torch.Tensor) -> None:
    """``sink += part`` (a parameter's local gradient); in float32 when the gradient is of lower precision."""
    sink.add_(part.to(sink.dtype))


def _own_rows(stacked: torch.Tensor, counts: list[int], rank: int) -> torch.Tensor:
    most = stacked.shape[0] // len(counts)
    return stacked[rank * most : rank * most + counts[rank]]


def _reduce_own_rows(partial: torch.Tensor, counts: list[int], group) -> torch.Tensor:
    """Sum ``partial [world * most, ...]`` over the ranks, each keeping its own rows (a reduce-scatter)."""
    world, rank = len(counts), dist.get_rank(group)
    most = partial.shape[0] // world
    out = partial.new_empty((most, *partial.shape[1:]))
    dist.reduce_scatter_tensor(out, partial.contiguous(), group=group)
    return out[: counts[rank]]


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, start: int, padding_idx: int | None, group, sink):
        flat = ids.reshape(-1)
        all_ids, counts = _gather_rows(flat, group)
        local = all_ids - start
        mine = (local >= 0) & (local < weight.shape[0])
        index = local.clamp(0, max(weight.shape[0] - 1, 0))
        partial = weight.index_select(0, index) if weight.shape[0] else weight.new_zeros((index.numel(), 0))
        partial = partial * mine.unsqueeze(-1).to(partial.dtype)
        out = _reduce_own_rows(partial, counts, group)
        if padding_idx is not None:  # nn.Embedding's padding row takes no gradient
            mine = mine & (all_ids != padding_idx)
        ctx.save_for_backward(index, mine)
        ctx.counts, ctx.group, ctx.sink = counts, group, sink
        return out.view(*ids.shape, weight.shape[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        index, mine = ctx.saved_tensors
        grads, _ = _gather_rows(grad.reshape(-1, grad.shape[-1]).contiguous(), ctx.group)
        sink = ctx.sink()  # the weight's gradient shard, added into in place (no second matrix-sized buffer)
        sink.index_add_(0, index[mine], grads[mine].to(sink.dtype))
        return None, None, None, None, None, None


class _Logits(torch.autograd.Function):
    """``hidden [T, H] @ weight^T`` over the whole vocabulary, from every rank's rows (all-to-all)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, vocab: int, group, sink):
        world = dist.get_world_size(group)
        all_hidden, counts = _gather_rows(hidden, group)
        most = all_hidden.shape[0] // world
        size = -(-vocab // world)
        part = all_hidden @ weight.t()  # [world * most, rows]
        if part.shape[1] < size:  # the last ranks' shards are short: pad to the common width
            part = torch.nn.functional.pad(part, (0, size - part.shape[1]))
        out = torch.empty_like(part)
        dist.all_to_all_single(out, part.contiguous(), group=group)  # rank q: its tokens, every rank's rows
        rank = dist.get_rank(group)
        logits = out.view(world, most, size).permute(1, 0, 2).reshape(most, world * size)[: counts[rank], :vocab]
        ctx.save_for_backward(all_hidden, weight)
        ctx.counts, ctx.group, ctx.size, ctx.vocab, ctx.sink = counts, group, size, vocab, sink
        return logits.contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        all_hidden, weight = ctx.saved_tensors
        counts, group, size, vocab = ctx.counts, ctx.group, ctx.size, ctx.vocab
        world = len(counts)
        most = all_hidden.shape[0] // world
        padded = grad.new_zeros((most, world * size))
        padded[: grad.shape[0], :vocab] = grad
        send = padded.view(most, world, size).permute(1, 0, 2).contiguous()
        back = torch.empty_like(send)
        dist.all_to_all_single(back, send, group=group)  # every rank's tokens, this rank's rows
        grad_part = back.view(world * most, size)[:, : weight.shape[0]].to(weight.dtype)
        if ctx.needs_input_grad[1]:
            sink = ctx.sink()
            if sink.dtype == grad_part.dtype:
                sink.addmm_(grad_part.t(), all_hidden)
            else:
                _add_into(sink, grad_part.t().float() @ all_hidden.float())
        grad_hidden = None
        if ctx.needs_input_grad[0]:
            grad_hidden = _reduce_own_rows(grad_part @ weight, counts, group)
        return grad_hidden, None, None, None, None


def _softmax_dtype(t: torch.Tensor) -> torch.dtype:
    """The logits' dtype here: float32 for lower precisions, float64 kept (a float64 model's tests compare
    against one learner's float64 logits)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _stats(h: torch.Tensor, weight: torch.Tensor, local_targets: torch.Tensor, mine: torch.Tensor, scale: float):
    """Per token of ``h``: this rank's rows' logit maximum, sum of ``exp(z - max)``, sum of
    ``exp(z - max) * z`` and the target's logit (0 when the target is not in these rows)."""
    dtype = _softmax_dtype(h)
    z = (h @ weight.t()).to(dtype)
    if scale != 1.0:
        z = z.mul_(scale)
    if z.shape[1] == 0:
        empty = torch.full((h.shape[0],), -torch.inf, device=h.device, dtype=dtype)
        zero = torch.zeros(h.shape[0], device=h.device, dtype=dtype)
        return torch.stack([empty, zero, zero, zero])
    target = z.gather(-1, local_targets.clamp(0, z.shape[1] - 1).unsqueeze(-1)).squeeze(-1) * mine
    m = z.amax(-1)
    e = (z - m.unsqueeze(-1)).exp_()
    return torch.stack([m, e.sum(-1), (e * z).sum(-1), target])


class _HeadLogp(torch.autograd.Function):
    """Log-probs of targets and entropies under ``hidden @ weight^T * scale`` over the whole vocabulary,
    each rank's rows reduced to four numbers per token; chunked, recomputed in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale: float, chunk: int, start: int, group, sink):
        all_hidden, counts = _gather_rows(hidden, group)
        all_targets, _ = _gather_rows(targets, group)
        local = all_targets - start
        mine = ((local >= 0) & (local < weight.shape[0])).float()
        parts = [
            _stats(all_hidden[s : s + chunk], weight, local[s : s + chunk], mine[s : s + chunk], scale)
            for s in range(0, all_hidden.shape[0], chunk)
        ]
        stats = torch.cat(parts, dim=1).contiguous()  # [4, world * most]
        world = len(counts)
        every = stats.new_empty((world * stats.shape[0], stats.shape[1]))
        dist.all_gather_into_tensor(every, stats, group=group)
        every = every.view(world, *stats.shape)
        m = every[:, 0].amax(0)
        weights = torch.where(every[:, 0] == -torch.inf, 0.0, (every[:, 0] - m).exp())
        total = (every[:, 1] * weights).sum(0)
        lse = m + total.log()
        entropy = lse - (every[:, 2] * weights).sum(0) / total
        logp = every[:, 3].sum(0) - lse
        ctx.save_for_backward(all_hidden, weight, local, mine, m, total, entropy)
        ctx.counts, ctx.group, ctx.scale, ctx.chunk, ctx.sink = counts, group, scale, chunk, sink
        rank = dist.get_rank(group)
        return _own_rows(logp, counts, rank).clone(), _own_rows(entropy, counts, rank).clone()

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        all_hidden, weight, local, mine, m, total, entropy = ctx.saved_tensors
        counts, group, scale, chunk = ctx.counts, ctx.group, ctx.scale, ctx.chunk
        dtype = _softmax_dtype(all_hidden)
        g_lp, _ = _gather_rows(grad_logp.to(dtype).contiguous(), group)
        g_ent, _ = _gather_rows(grad_entropy.to(dtype).contiguous(), group)
        need_w = ctx.needs_input_grad[1]
        sink = ctx.sink() if need_w else None
        direct = sink is not None and sink.dtype == dtype
        grad_w = None if not need_w else sink if direct else weight.new_zeros(weight.shape, dtype=dtype)
        grad_h = torch.empty(all_hidden.shape, dtype=all_hidden.dtype, device=all_hidden.device)
        rows = weight.shape[0]
        for s in range(0, all_hidden.shape[0], chunk):
            h = all_hidden[s : s + chunk]
            if rows == 0:
                grad_h[s : s + chunk] = 0
                continue
            z = (h @ weight.t()).to(dtype)
            if scale != 1.0:
                z = z.mul_(scale)
            mc, tc = m[s : s + chunk].unsqueeze(-1), total[s : s + chunk].unsqueeze(-1)
            p = (z - mc).exp_().div_(tc)  # softmax over the whole vocabulary, these rows (as ChunkedHeadLogp)
            logq = z.sub_(mc + tc.log())
            ge = g_ent[s : s + chunk].unsqueeze(-1)
            gl = g_lp[s : s + chunk].unsqueeze(-1)
            # dH/dz = -p (log p + H); dlogp/dz = onehot(y) - p
            gz = p.mul_(logq.add_(entropy[s : s + chunk].unsqueeze(-1)).mul_(ge).add_(gl)).neg_()
            y = local[s : s + chunk].clamp(0, rows - 1).unsqueeze(-1)
            gz.scatter_add_(-1, y, gl * mine[s : s + chunk].unsqueeze(-1))
            if scale != 1.0:
                gz = gz.mul_(scale)
            gz = gz.to(weight.dtype)
            grad_h[s : s + chunk] = gz @ weight
            if need_w:
                grad_w.addmm_(gz.t().to(dtype), h.to(dtype))
        if need_w and not direct:
            _add_into(sink, grad_w)
        grad_hidden = _reduce_own_rows(grad_h, counts, group)
        return grad_hidden, None, None, None, None, None, None, None


class VocabParallel:
    """The embedding matrix (and an untied LM head's) of one model, split by rows over ``mesh``."""

    def __init__(self, model: torch.nn.Module, mesh: DeviceMesh):
        self.group = mesh.get_group()
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.embedding = model.get_input_embeddings()
        self.head = model.get_output_embeddings()
        self.tied = self.head.weight is self.embedding.weight
        self.vocab = self.embedding.weight.shape[0]
        self.start, _ = rows_of(self.vocab, self.rank, self.world)
        embed = self._distribute(self.embedding.weight, mesh)
        self.embedding.weight = embed
        self.head.weight = embed if self.tied else self._distribute(self.head.weight, mesh)
        self.head_start, _ = rows_of(self.head.weight.shape[0], self.rank, self.world)
        self.rows = -(-self.head.weight.shape[0] // self.world)  # the head's rows on a rank (the first ranks')
        self.embedding.forward = self._embed  # type: ignore[method-assign]
        self.head.forward = self._logits  # type: ignore[method-assign]
        self.head.vocab_parallel = self  # read by learner/logprobs.py's chunked head
        self._whole: list[tuple[torch.nn.Module, torch.nn.Parameter]] = []

    @staticmethod
    def of(head: torch.nn.Module) -> VocabParallel | None:
        """The vocabulary-parallel split of an LM head, while it is active (not inside ``whole``), else None."""
        parallel = getattr(head, "vocab_parallel", None)
        return parallel if parallel is not None and parallel.active() else None

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """A plain ``nn.Embedding`` and a bias-free ``nn.Linear`` head (not one LoRA wraps)."""
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
        return type(embedding) is torch.nn.Embedding and type(head) is torch.nn.Linear and head.bias is None

    @staticmethod
    def _distribute(weight: torch.nn.Parameter, mesh: DeviceMesh) -> torch.nn.Parameter:
        return torch.nn.Parameter(distribute_tensor(weight.data, mesh, [Shard(0)]), weight.requires_grad)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self.embedding.weight] if self.tied else [self.embedding.weight, self.head.weight]

    @staticmethod
    def _sink(param: torch.nn.Parameter):
        """The local shard of ``param``'s gradient, made (zeros) when there is none: the functions above
        add their weight gradient into it in place and give autograd none, so no matrix-sized gradient
        is ever made beside it."""

        def local() -> torch.Tensor:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            return param.grad._local_tensor

        return local

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        weight = self.embedding.weight
        if not isinstance(weight, DTensor):  # inside ``whole``
            return torch.nn.functional.embedding(ids, weight, self.embedding.padding_idx)
        local = weight.to_local()
        return _Embedding.apply(ids, local, self.start, self.embedding.padding_idx, self.group, self._sink(weight))

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.head.weight
        if not isinstance(weight, DTensor):
            return torch.nn.functional.linear(hidden, weight)
        flat = hidden.reshape(-1, hidden.shape[-1])
        logits = _Logits.apply(flat, weight.to_local(), weight.shape[0], self.group, self._sink(weight))
        return logits.view(*hidden.shape[:-1], weight.shape[0])

    def active(self) -> bool:
        """False inside ``whole``: the head is a plain module then."""
        return isinstance(self.head.weight, DTensor)

    def logp_entropy(
        self, hidden: torch.Tensor, targets: torch.Tensor, scale: float, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat ``hidden [N, H]``'s target log-probs and entropies under the head (``_HeadLogp``)."""
        weight = self.head.weight
        local = weight.to_local()
        return _HeadLogp.apply(hidden, local, targets, scale, chunk, self.head_start, self.group, self._sink(weight))

    @contextmanager
    def whole(self) -> Iterator[None]:
        """The matrices gathered whole and the modules plain inside (a collective on entry)."""
        saved = [(self.embedding, self.embedding.weight)]
        if not self.tied:
            saved.append((self.head, self.head.weight))
        full = {id(p): torch.nn.Parameter(p.full_tensor(), p.requires_grad) for _, p in saved}
        self.embedding.weight = full[id(saved[0][1])]
        self.head.weight = full[id(saved[-1][1])] if not self.tied else self.embedding.weight
        try:
            yield
        finally:
            self.embedding.weight = saved[0][1]
            self.head.weight = saved[-1][1] if not self.tied else saved[0][1]
