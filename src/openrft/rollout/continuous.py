"""Continuous batching in the local generator, with each conversation's KV cache kept across its turns.

A ``DecodeSession`` runs one decode batch that requests join and leave between decode steps: a request
(a context's token ids, ``n`` samples, a token limit) submitted while other rows are decoding is prefilled
and merged into the running batch at the next step, and a row that ends (an end token or its limit) is
handed to its callback at once, without waiting for the rest of the batch.

Requests may carry a key (a tool episode's id). When a keyed row ends, the KV cache of every token the
model has read for it (its context and its sampled tokens but the last) is kept under the key with those
token ids and the policy version. A later request with the same key whose context starts with exactly
those ids, under the same policy version, prefills only the new tokens (the last sampled token, the tool
results, the template's tokens) on top of the kept cache instead of the whole conversation. Anything else
(other ids, a new policy version) is stale: the kept cache is dropped and the context prefilled afresh.

Layout: the batch is left-padded ``[rows, width]``; a row's columns are its tokens in order with masked
holes where it waited (an admitted row's kept cache, then padding, then its new tokens), and its position
ids count its own tokens only, so a hole changes nothing the model computes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from openrft.rollout.sampling import sample_tokens
from openrft.rollout.types import Completion, SamplingParams

Done = Callable[[Completion], bool | None]
"""Called with a row's completion when it ends; returning False says its conversation ends there (its KV cache
is then not kept)."""
COMPACT_FRACTION = 0.25
"""Rows that have ended ride along masked until this share of the batch has ended (or a request is admitted)."""
SQUEEZE_SLACK = 64
"""Columns a batch may grow past twice its longest row (holes from admissions) before it is squeezed."""
KEPT_TOKENS = 1 << 22
"""The most cached tokens (over every kept conversation) a session holds; the least recently used go first."""
SPARE_COLUMNS = 32
"""Room left for decode steps in a cache the session copies anyway (an admission's join), so that the next
steps write into it instead of growing (copying) it again."""


@dataclass
class Kept:
    """A conversation's KV cache between its turns: per layer ``(keys, values)`` ``[heads, tokens, dim]``."""

    ids: list[int]
    version: int
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class KVStore:
    """Kept caches by key, found only for a context they are an exact prefix of, under the same policy version."""

    def __init__(self, max_tokens: int = KEPT_TOKENS):
        self.max_tokens = max_tokens
        self._kept: OrderedDict[Hashable, Kept] = OrderedDict()
        self.hits = self.misses = self.stale = 0
        self.reused_tokens = 0

    def put(self, key: Hashable, kept: Kept) -> None:
        self._kept.pop(key, None)
        self._kept[key] = kept
        while sum(len(k.ids) for k in self._kept.values()) > self.max_tokens and len(self._kept) > 1:
            self._kept.popitem(last=False)

    def take(self, key: Hashable | None, context: list[int], version: int) -> Kept | None:
        """The kept cache for ``context`` (removed from the store: the row's next end keeps a new one)."""
        kept = self._kept.pop(key, None) if key is not None else None
        if kept is None:
            self.misses += 1
            return None
        cached = len(kept.ids)
        if kept.version != version or cached >= len(context) or context[:cached] != kept.ids:
            self.stale += 1
            return None
        self.hits += 1
        self.reused_tokens += cached
        return kept

    def clear(self) -> None:
        self._kept.clear()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._kept


@dataclass
class _Row:
    context: list[int]
    limit: int
    done: Done
    key: Hashable | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False


@dataclass
class _Request:
    context: list[int]
    limits: list[int]
    callbacks: list[Done]
    keys: list[Hashable | None]


class GrowingLayer(DynamicLayer):
    """A cache layer that writes new states into spare room at the end of its buffers (doubled when full)
    instead of concatenating: a decode step copies one column, not the whole cache."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int | None = None):
        """``keys``/``values``: buffers whose first ``length`` columns (default: all) hold states, the rest spare."""
        self.is_initialized, self.device = True, keys.device  # what DynamicLayer's lazy_initialization sets
        self._keys, self._values = keys, values
        self.length = keys.shape[2] if length is None else length

    @property
    def keys(self) -> torch.Tensor:
        return self._keys[:, :, : self.length]

    @keys.setter
    def keys(self, tensor: torch.Tensor) -> None:
        self._keys, self.length = tensor, tensor.shape[2]

    @property
    def values(self) -> torch.Tensor:
        return self._values[:, :, : self.length]

    @values.setter
    def values(self, tensor: torch.Tensor) -> None:
        self._values = tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[2]
        if end > self._keys.shape[2]:
            room = max(end, 2 * self._keys.shape[2])
            self._keys = _right_pad(self._keys[:, :, : self.length], room)
            self._values = _right_pad(self._values[:, :, : self.length], room)
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._keys = self._keys.repeat_interleave(repeats, dim=0)
        self._values = self._values.repeat_interleave(repeats, dim=0)


def _right_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    shape = list(tensor.shape)
    shape[2] = width - tensor.shape[2]
    return torch.cat([tensor, tensor.new_zeros(shape)], dim=2)


def _cache(layers: list[tuple[torch.Tensor, torch.Tensor]], length: int | None = None) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [GrowingLayer(keys, values, length) for keys, values in layers]
    return cache


def _growing(cache: DynamicCache) -> DynamicCache:
    """``cache`` (as a forward pass filled it) with growing layers."""
    if all(isinstance(layer, GrowingLayer) for layer in cache.layers):
        return cache
    return _cache([(layer.keys, layer.values) for layer in cache.layers])


def _stacked(parts: list[torch.Tensor], width: int, room: int) -> torch.Tensor:
    """``parts`` (``[rows, heads, tokens, dim]``) stacked by rows in one buffer of ``room`` columns, each part's
    columns right-aligned at ``width`` (left padding before them, spare room after)."""
    first = parts[0]
    out = first.new_zeros((sum(p.shape[0] for p in parts), first.shape[1], room, first.shape[-1]))
    row = 0
    for part in parts:
        out[row : row + part.shape[0], :, width - part.shape[2] : width] = part
        row += part.shape[0]
    return out


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class DecodeSession:
    """One continuous decode batch of a ``TransformersGenerator`` (see the module docstring). Single-threaded:
    the caller ``submit``s and calls ``step`` until it has nothing left to wait for; callbacks run in ``step``."""

    def __init__(self, generator, params: SamplingParams, rng: torch.Generator, store: KVStore | None = None):
        self.g, self.params, self.rng = generator, params, rng
        self.store = store if store is not None else KVStore()
        self.max_rows = generator.max_batch_sequences
        self.device = generator.device
        self.is_end: torch.Tensor | None = None
        self.pending: list[_Request] = []
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        self.mask = self.positions = self.logits = None
        self.steps = self.prefilled_tokens = 0

    @property
    def busy(self) -> bool:
        return bool(self.pending) or any(not row.finished for row in self.rows)

    def submit(
        self,
        context: list[int],
        limits: list[int],
        callbacks: list[Done],
        keys: list[Hashable | None] | None = None,
    ) -> None:
        """``len(callbacks)`` samples continuing ``context`` (one shared prefill), the i-th with at most
        ``limits[i]`` tokens, handed to ``callbacks[i]`` when it ends; ``keys[i]``: its conversation's key."""
        if not context:
            raise ValueError("a decode request needs at least one context token")
        keys = list(keys) if keys is not None else [None] * len(callbacks)
        if not (len(limits) == len(callbacks) == len(keys)) or not callbacks:
            raise ValueError("a decode request needs one limit, callback and key per sample, at least one sample")
        self.pending.append(_Request(list(context), [max(1, int(x)) for x in limits], list(callbacks), keys))

    # one step ------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> None:
        """Sample one token for every decoding row and hand ended rows over; read the rest's tokens (one pass),
        then prefill the requests admitted now (a second pass) and join them to the batch."""
        token = None
        if self.logits is not None:
            self.steps += 1
            p = self.params
            if self.is_end is None:
                self.is_end = self.g._end_table(self.logits.shape[-1], self.device, p)
            token, logp = sample_tokens(self.logits, p.temperature, p.top_k, p.top_p, self.rng, p.min_p)
            self.logits = None
            ended = self.is_end[token].tolist()
            for i, (row, t, lp) in enumerate(zip(self.rows, token.tolist(), logp.tolist())):
                if row.finished:
                    continue
                row.tokens.append(t)
                row.logprobs.append(lp)
                if ended[i] or len(row.tokens) >= row.limit:
                    self._finish(i, row, bool(ended[i]))
        live = [i for i, row in enumerate(self.rows) if not row.finished]
        ended_share = 1 - len(live) / len(self.rows) if self.rows else 0.0
        if len(live) < len(self.rows) and (self.pending or not live or ended_share >= COMPACT_FRACTION):
            self._select(live)
            token = token[live] if token is not None and live else None
        if any(not row.finished for row in self.rows):
            self._forward(token, [])
        else:
            self._select([])
        admitted = self._take_admitted()
        if admitted:
            self._prefill(admitted)

    def _prefill(self, admitted: list[_Request]) -> None:
        """The admitted requests in a pass of their own (the running rows' single tokens are not padded to
        their width), their rows then joined to the batch."""
        state = self.rows, self.cache, self.mask, self.positions, self.logits
        self.rows, self.cache, self.mask, self.positions, self.logits = [], None, None, None, None
        self._forward(None, admitted)
        rows, cache, mask, positions, logits = state
        if not rows:
            return
        width = max(mask.shape[1], self.mask.shape[1])
        for mine, theirs in zip(cache.layers, self.cache.layers):
            keys = _stacked([mine.keys, theirs.keys], width, width + SPARE_COLUMNS)
            values = _stacked([mine.values, theirs.values], width, width + SPARE_COLUMNS)
            mine._keys, mine._values, mine.length = keys, values, width
        self.mask = torch.cat([_left_pad(mask, width, 1), _left_pad(self.mask, width, 1)])
        self.positions = torch.cat([positions, self.positions])
        self.logits = torch.cat([logits, self.logits])
        self.rows, self.cache = rows + self.rows, cache

    def _finish(self, i: int, row: _Row, stopped: bool) -> None:
        """Hand the row over; keep its cache under its key unless the callback says its conversation ends."""
        row.finished = True
        text_ids = row.tokens[:-1] if stopped else row.tokens
        goes_on = row.done(
            Completion(
                prompt_ids=list(row.context),
                token_ids=list(row.tokens),
                logprobs=list(row.logprobs),
                text=self.g.tokenizer.decode(text_ids, skip_special_tokens=True),
                finish_reason="stop" if stopped else "length",
                policy_version=self.g.policy_version,
            )
        )
        if row.key is not None and goes_on is not False:
            read = self.mask[i].nonzero().squeeze(-1)  # every token the model has read for this row
            layers = [(layer.keys[i][:, read].clone(), layer.values[i][:, read].clone()) for layer in self.cache.layers]
            self.store.put(row.key, Kept(row.context + row.tokens[:-1], self.g.policy_version, layers))

    def _select(self, keep: list[int]) -> None:
        """Only the rows ``keep`` stay, their columns squeezed when holes have made the batch twice as wide as
        its longest row."""
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.mask = self.positions = self.logits = None
            return
        index = torch.tensor(keep, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        counts = self.mask.sum(dim=1)
        longest = int(counts.max())
        if self.mask.shape[1] > 2 * longest + SQUEEZE_SLACK:
            self._squeeze(counts, longest)

    def _squeeze(self, counts: torch.Tensor, width: int) -> None:
        """Each row's read columns moved right-aligned into ``width`` columns (the holes and left padding gone)."""
        rows, old = self.mask.shape
        order = torch.sort(self.mask * old + torch.arange(old, device=self.device), dim=1, stable=True).indices
        source = order[:, old - width :]  # the read columns, in order, at the right; padding columns to their left
        for layer in self.cache.layers:
            index = source[:, None, :, None].expand(rows, layer.keys.shape[1], width, layer.keys.shape[-1])
            keys = layer.keys.gather(2, index)
            values = layer.values.gather(2, index.expand(-1, layer.values.shape[1], -1, layer.values.shape[-1]))
            layer.keys, layer.values = keys, values
        columns = torch.arange(width, device=self.device)
        self.mask = (columns[None, :] >= (width - counts)[:, None]).long()

    # admission ------------------------------------------------------------------------------------

    def _take_admitted(self) -> list[_Request]:
        room = self.max_rows - sum(not row.finished for row in self.rows)
        admitted: list[_Request] = []
        while self.pending and (len(self.pending[0].callbacks) <= room or not (self.rows or admitted)):
            request = self.pending.pop(0)
            room -= len(request.callbacks)
            admitted.append(request)
        return admitted

    def _forward(self, token: torch.Tensor | None, admitted: list[_Request]) -> None:
        """One pass: each running row's last token, and each admitted request's new tokens on top of its kept
        cache (a request of ``n`` samples prefilled once, its row then repeated)."""
        running = len(self.rows)
        # a single keyed sample may continue its kept cache; a request of n samples shares one fresh prefill
        kept = [
            self.store.take(r.keys[0], r.context, self.g.policy_version) if len(r.keys) == 1 else None for r in admitted
        ]
        cached = [len(k.ids) if k is not None else 0 for k in kept]
        suffix = [r.context[c:] for r, c in zip(admitted, cached)]
        new_width = max([1, *(len(x) for x in suffix)])
        old_width = max([self.mask.shape[1] if running else 0, *cached])
        rows = running + len(admitted)
        ids = torch.full((rows, new_width), self.g.pad_token_id, dtype=torch.long)
        new_mask = torch.zeros((rows, new_width), dtype=torch.long)
        positions = torch.zeros((rows, new_width), dtype=torch.long)
        if running:
            last = token.masked_fill(
                torch.tensor([r.finished for r in self.rows], device=token.device), self.g.pad_token_id
            )
            ids[:running, -1] = last.cpu()
            new_mask[:running, -1] = torch.tensor([0 if r.finished else 1 for r in self.rows])
            positions[:running, -1] = (self.positions + 1).cpu()
        for j, (c, x) in enumerate(zip(cached, suffix)):
            ids[running + j, new_width - len(x) :] = torch.tensor(x, dtype=torch.long)
            new_mask[running + j, new_width - len(x) :] = 1
            positions[running + j, new_width - len(x) :] = torch.arange(c, c + len(x))
        if admitted:
            cache, old_mask = self._joined_cache(kept, cached, old_width, old_width + new_width + SPARE_COLUMNS)
        else:
            cache, old_mask = self.cache, self.mask
        mask = torch.cat([old_mask, new_mask.to(self.device)], dim=1)
        self.prefilled_tokens += sum(len(x) for x in suffix)
        logits = self.g.model(
            input_ids=ids.to(self.device),
            attention_mask=mask,
            position_ids=positions.to(self.device),
            use_cache=True,
            logits_to_keep=1,
            **{self.g._cache_kwarg: cache},
        ).logits[:, -1, :]
        cache = _growing(cache)
        last_positions = positions[:, -1].to(self.device)
        self.rows += [
            _Row(r.context, limit, done, key)
            for r in admitted
            for limit, done, key in zip(r.limits, r.callbacks, r.keys)
        ]
        repeat = [*range(running), *(running + j for j, r in enumerate(admitted) for _ in r.callbacks)]
        if len(repeat) != rows:
            index = torch.tensor(repeat, device=self.device)
            cache.batch_select_indices(index)
            logits, mask, last_positions = logits[index], mask[index], last_positions[index]
        self.cache, self.mask, self.positions, self.logits = cache, mask, last_positions, logits

    def _joined_cache(
        self, kept: list[Kept | None], cached: list[int], width: int, room: int
    ) -> tuple[DynamicCache, torch.Tensor]:
        """The running rows' cache and mask left-padded to ``width`` columns, with the admitted rows' kept caches
        right-aligned under them (an empty cache when there is nothing cached); the cache's buffers hold
        ``room`` columns, so that the pass's new tokens are written in place."""
        running = len(self.rows)
        mask = torch.zeros((running + len(kept), width), dtype=torch.long, device=self.device)
        if running:
            mask[:running] = _left_pad(self.mask, width, 1)
        for j, c in enumerate(cached):
            mask[running + j, width - c :] = 1 if c else 0
        if width == 0:
            return DynamicCache(), mask
        source = self.cache.layers if running else next(k for k in kept if k is not None).layers
        layers = []
        for index, layer in enumerate(source):
            keys, values = (layer.keys, layer.values) if running else (layer[0][None], layer[1][None])
            k_out = keys.new_zeros((running + len(kept), keys.shape[1], room, keys.shape[-1]))
            v_out = values.new_zeros((running + len(kept), values.shape[1], room, values.shape[-1]))
            if running:
                k_out[:running, :, width - keys.shape[2] : width] = keys
                v_out[:running, :, width - values.shape[2] : width] = values
            for j, (k, c) in enumerate(zip(kept, cached)):
                if k is not None:
                    k_out[running + j, :, width - c : width] = k.layers[index][0]
                    v_out[running + j, :, width - c : width] = k.layers[index][1]
            layers.append((k_out, v_out))
        return _cache(layers, width), mask
