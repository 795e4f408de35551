"""One long sequence's forward and backward in pieces along the sequence, so that the Tinker worker can serve
other tenants' calls between the pieces (futures.py) while the gradient stays the whole sequence's.

A causal LM's later positions read the earlier ones' keys and values, so the pieces cannot simply be
accumulated like micro-batches: piece ``k`` runs on top of the KV cache of pieces ``0..k-1``, held as detached
leaves (``requires_grad``), and its log-probs keep their graph. The loss is computed once on all the pieces'
log-probs (any loss, sequence-level ones included). Backward then runs piece by piece from the last one: each
piece's backward takes the loss's gradient at its log-probs plus the gradient that later pieces sent into its
keys and values (accumulated on its leaves), and sends its own share into earlier pieces' leaves and into the
adapter. Every parameter's gradient is that of one backward through the whole sequence, to float rounding.
The cost is a piece's graph kept until its backward (as the whole sequence's would be) and one slice per layer.
"""

from __future__ import annotations

from collections.abc import Generator

import torch
from transformers import DynamicCache

from openrft.rollout.kv import cache_keyword


def bounds(length: int, piece: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each piece: ``length`` tokens in runs of at most ``piece``, the same size or so."""
    count = -(-length // piece)
    size = -(-length // count)
    return [(start, min(start + size, length)) for start in range(0, length, size)]


class Pieces:
    """The state between a sequence's pieces: each piece's log-probs (with graph), its new keys and values
    (with graph) and their detached leaves, which later pieces read."""

    def __init__(self, model: torch.nn.Module, tokens: list[int], targets: torch.Tensor, piece: int) -> None:
        self.model, self.tokens, self.targets = model, tokens, targets
        self.spans = bounds(len(tokens), piece)
        self.keyword = cache_keyword(model)
        self.logps: list[torch.Tensor] = []
        self.outputs: list[list[torch.Tensor]] = []  # per piece: every layer's new keys, then its new values
        self.leaves: list[list[torch.Tensor]] = []  # the same, detached: what later pieces attend to

    def forward(self, index: int) -> None:
        """Piece ``index`` (after every earlier one) on top of the earlier pieces' cache."""
        start, stop = self.spans[index]
        cache = DynamicCache()
        if self.leaves:
            layers = len(self.leaves[0]) // 2
            for layer in range(layers):
                keys = torch.cat([piece[layer] for piece in self.leaves], dim=-2)
                values = torch.cat([piece[layers + layer] for piece in self.leaves], dim=-2)
                cache.update(keys, values, layer)
        ids = torch.tensor([self.tokens[start:stop]])
        logits = self.model(
            input_ids=ids,
            attention_mask=torch.ones((1, stop), dtype=torch.long),
            position_ids=torch.arange(start, stop).unsqueeze(0),
            use_cache=True,
            **{self.keyword: cache},
        ).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        self.logps.append(logp.gather(-1, self.targets[start:stop].unsqueeze(-1)).squeeze(-1))
        new = [layer.keys[:, :, start:] for layer in cache.layers]
        new += [layer.values[:, :, start:] for layer in cache.layers]
        self.outputs.append(new)
        grad = torch.is_grad_enabled()
        self.leaves.append([t.detach().requires_grad_(grad) for t in new])

    def logprobs(self) -> torch.Tensor:
        """The whole sequence's log-probs, with the graph into every piece."""
        return torch.cat(self.logps)

    def backward(self, loss: torch.Tensor) -> Generator[None, None, None]:
        """The loss's gradient through every piece, the last first, yielding between pieces."""
        at_logps = torch.autograd.grad(loss, self.logps, allow_unused=True)
        for index in reversed(range(len(self.spans))):
            tensors, grads = [], []
            if at_logps[index] is not None:
                tensors.append(self.logps[index])
                grads.append(at_logps[index])
            for output, leaf in zip(self.outputs[index], self.leaves[index]):
                if leaf.grad is not None:  # what later pieces sent into this piece's keys and values
                    tensors.append(output)
                    grads.append(leaf.grad)
            if tensors:
                torch.autograd.backward(tensors, grads)
            self.logps[index] = self.logps[index].detach()
            self.outputs[index] = []
            self.leaves[index] = []
            if index:
                yield


def run(
    model: torch.nn.Module, tokens: list[int], targets: torch.Tensor, piece: int, loss_of, backward: bool
) -> Generator[None, None, tuple[torch.Tensor, torch.Tensor]]:
    """A generator: ``tokens``' log-probs and ``loss_of(logprobs)`` (both returned detached), computed piece by
    piece with a ``yield`` between pieces; the loss's gradient accumulated (``backward``) in the model's
    parameters. ``loss_of`` may raise to refuse the loss before any gradient is accumulated."""
    with torch.set_grad_enabled(backward):
        pieces = Pieces(model, tokens, targets, piece)
    for index in range(len(pieces.spans)):
        if index:
            yield
        with torch.set_grad_enabled(backward):
            pieces.forward(index)
    with torch.set_grad_enabled(backward):
        logps = pieces.logprobs()
        loss = loss_of(logps)
    if backward:
        yield
        yield from pieces.backward(loss)
    return logps.detach(), loss.detach()
