"""Attention of many responses over one shared prompt, with the prompt's keys and values held once.

The learner scores the ``n`` responses of a prompt on one prefill of it (``learner/logprobs.py``), and the generator
samples them from one (``rollout/local.py``). Gathering the prompt's KV cache onto every response row
(``DynamicCache.batch_select_indices``) turns the responses' attention into a batched SDPA over ``n`` copies of the
prompt's keys, whose backward on CPU zero-fills, fills and then sums a gradient for every copy: on the demo job
(256 rows of 4 tokens over 33-token prompts, 4 layers) that attention took about a third of the learner's step.
Decoding, each step also copied the whole gathered cache to append one token to it.

Here the cache keeps each prompt once (``SharedPrefixLayer``) and the attention is written out in two parts
joined by one softmax: the scores over the prompt, the queries of all a prompt's rows in one matmul against its
keys, and the scores over the row's own earlier tokens. The result is that of SDPA over the gathered cache with
the same mask (``tests/core/test_prefix_attention.py``).

The cache layer hands the new keys to the attention function with a tag naming itself (transformers' attention
modules pass what the cache returns straight on); ``attention.chunked_sdpa`` sees the tag and calls
``prefix_attention``. Each layer counts the updates it tagged and the attentions that used them, so a model that
changed the keys in between (and lost the tag) is caught (``SharedPrefix.check``) instead of attending to its
responses alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

TAG = "_openrft_shared_prefix"
# Taken while the scores it keeps for backward (about two ``[rows, heads, queries, keys]`` tensors) take at most this
# times the memory of the gathered keys and values (``2 x [rows, kv_heads, keys, head_dim]``): short responses.
MEMORY_RATIO = 1.0


@dataclass
class PrefixGroups:
    """Which prompt each row continues, and which of its own tokens each row may attend to."""

    prompt_index: torch.Tensor  # [rows]: the prompt each row continues
    prompt_mask: torch.Tensor  # [prompts, prompt_width] bool: the prompts' real (not padding) positions
    key_mask: torch.Tensor | None  # [rows, own_width] bool: the rows' own tokens that can be attended; None: all
    per_prompt: int  # slots per prompt: the most rows any prompt has
    slots: torch.Tensor | None  # [rows]: row -> slot ``prompt * per_prompt + k``; None when row i is slot i

    @classmethod
    def build(
        cls, prompt_index: torch.Tensor, prompt_mask: torch.Tensor, key_mask: torch.Tensor | None = None
    ) -> PrefixGroups:
        prompts = prompt_mask.shape[0]
        counts = torch.bincount(prompt_index, minlength=prompts)
        per_prompt = max(int(counts.max()), 1) if len(prompt_index) else 1
        order = torch.argsort(prompt_index, stable=True)
        first = torch.cumsum(counts, 0) - counts  # the first sorted position of each prompt's rows
        rank = torch.empty_like(prompt_index)
        rank[order] = torch.arange(len(prompt_index), device=prompt_index.device) - first[prompt_index[order]]
        slots = prompt_index * per_prompt + rank
        identity = len(slots) == prompts * per_prompt and bool(
            (slots == torch.arange(len(slots), device=slots.device)).all()
        )
        keys = None if key_mask is None else key_mask.bool()
        return cls(prompt_index, prompt_mask.bool(), keys, per_prompt, None if identity else slots)

    def rows_kept(self, indices: torch.Tensor) -> PrefixGroups:
        """The groups of rows ``indices`` (a decode batch dropping its ended rows)."""
        keys = None if self.key_mask is None else self.key_mask[indices]
        return PrefixGroups.build(self.prompt_index[indices], self.prompt_mask, keys)

    def own_visible(self, queries: int, keys: int) -> torch.Tensor:
        """``[rows or 1, queries, keys]``: the row's own keys each query sees, the queries being its last ones."""
        causal = torch.ones(queries, keys, dtype=torch.bool, device=self.prompt_mask.device).tril(keys - queries)
        return causal[None] if self.key_mask is None else causal & self.key_mask[:, None, :]

    def to_slots(self, rows: torch.Tensor) -> torch.Tensor:
        """``[rows, ...]`` laid out as ``[prompts * per_prompt, ...]``, empty slots zero."""
        if self.slots is None:
            return rows
        shape = (self.prompt_mask.shape[0] * self.per_prompt, *rows.shape[1:])
        return rows.new_zeros(shape).index_copy(0, self.slots, rows)

    def to_rows(self, slots: torch.Tensor) -> torch.Tensor:
        return slots if self.slots is None else slots.index_select(0, self.slots)


class SharedPrefixLayer(DynamicLayer):
    """A cache layer holding each prompt's keys and values once (``keys``/``values``: ``[prompts, kv_heads,
    prompt_width, head_dim]``) for rows that continue them. ``update`` returns the rows' own states, tagged, for
    ``prefix_attention``: the new ones alone (the learner: read-only, so that a layer replayed in backward sees the
    same keys), or appended to those of earlier calls (``grows``: decoding)."""

    groups: PrefixGroups
    grows: bool
    own_keys: torch.Tensor | None
    own_values: torch.Tensor | None
    tagged: int
    attended: int

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.grows:
            if self.own_keys is not None:
                key_states = torch.cat([self.own_keys, key_states], dim=-2)
                value_states = torch.cat([self.own_values, value_states], dim=-2)
            self.own_keys, self.own_values = key_states, value_states
        setattr(key_states, TAG, self)
        self.tagged += 1
        return key_states, value_states

    def get_seq_length(self) -> int:
        own = 0 if self.own_keys is None else self.own_keys.shape[-2]
        return self.keys.shape[-2] + own

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices``; every prompt stays."""
        if self.own_keys is not None:
            self.own_keys, self.own_values = self.own_keys[indices], self.own_values[indices]
        self.groups = self.groups.rows_kept(indices)


@dataclass
class SharedPrefix:
    """A cache whose layers were made ``SharedPrefixLayer``s."""

    layers: list[SharedPrefixLayer]

    def check(self) -> None:
        """Raise if some layer's new keys reached an attention that did not see the prompt."""
        for index, layer in enumerate(self.layers):
            if layer.tagged != layer.attended:
                raise RuntimeError(
                    f"layer {index}: {layer.tagged} cache updates but {layer.attended} shared-prefix attentions: "
                    "the model transforms the keys between its cache and its attention function"
                )


def share_prefix(
    config: PretrainedConfig,
    cache: DynamicCache,
    groups_of: Callable[[], PrefixGroups],
    queries: int,
    grows: bool = False,
) -> SharedPrefix | None:
    """Make ``cache`` (filled by the prompts of a model with ``config``, whose attention function is
    ``attention.chunked_sdpa``) a shared-prefix cache for rows of ``queries`` new tokens a pass (``grows``: decoding,
    each pass appending its tokens), or return None (the cache unchanged) where ``prefix_attention`` does not apply:
    a layer that is not a plain full-attention ``DynamicLayer``, or more queries than ``MEMORY_RATIO`` allows.
    ``groups_of()`` builds the ``PrefixGroups`` (only called when the cache is shared)."""
    config = config.get_text_config()
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return None
    if not cache.layers or not all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers):
        return None
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if heads * queries > MEMORY_RATIO * kv_heads * head_dim:
        return None
    groups = groups_of()
    for i, layer in enumerate(cache.layers):
        shared = SharedPrefixLayer.__new__(SharedPrefixLayer)
        shared.__dict__.update(layer.__dict__)
        shared.groups, shared.grows, shared.tagged, shared.attended = groups, grows, 0, 0
        shared.own_keys = shared.own_values = None
        cache.layers[i] = shared
    return SharedPrefix(list(cache.layers))


def prefix_layer(key: torch.Tensor) -> SharedPrefixLayer | None:
    return getattr(key, TAG, None)


def prefix_attention(
    layer: SharedPrefixLayer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """``query`` ``[rows, heads, width, head_dim]`` (the rows' last ``width`` tokens) and the rows' own ``key``/
    ``value`` ``[rows, kv_heads, own_width, head_dim]``, attending to their prompt (``layer``) and to their own
    tokens up to each query's; output ``[rows, width, heads, head_dim]`` (what transformers' attention functions
    return)."""
    layer.attended += 1
    groups = layer.groups
    rows, heads, width, dim = query.shape
    prompts, kv_heads, prompt_width, _ = layer.keys.shape
    own_width = key.shape[-2]
    group, per_prompt = heads // kv_heads, groups.per_prompt

    def by_prompt(t: torch.Tensor) -> torch.Tensor:  # [rows, heads, width, x] -> [prompts, kv_heads, n*g*width, x]
        t = groups.to_slots(t).reshape(prompts, per_prompt, kv_heads, group, width, t.shape[-1])
        return t.transpose(1, 2).reshape(prompts, kv_heads, per_prompt * group * width, t.shape[-1])

    def by_row(t: torch.Tensor) -> torch.Tensor:  # the inverse of ``by_prompt``
        t = t.reshape(prompts, kv_heads, per_prompt, group, width, t.shape[-1]).transpose(1, 2)
        return groups.to_rows(t.reshape(prompts * per_prompt, heads, width, t.shape[-1]))

    hidden = torch.finfo(query.dtype).min
    on_prompt = (by_prompt(query) @ layer.keys.transpose(-1, -2)) * scaling
    on_prompt = by_row(on_prompt.masked_fill(~groups.prompt_mask[:, None, None, :], hidden))
    on_own = (query.reshape(rows, kv_heads, group * width, dim) @ key.transpose(-1, -2)) * scaling
    visible = groups.own_visible(width, own_width)
    on_own = on_own.reshape(rows, heads, width, own_width).masked_fill(~visible[:, None], hidden)
    probs = torch.cat([on_prompt, on_own], dim=-1).softmax(dim=-1)
    if dropout > 0:
        probs = torch.nn.functional.dropout(probs, dropout)
    from_prompt, from_own = probs.split([prompt_width, own_width], dim=-1)
    out = by_row(by_prompt(from_prompt) @ layer.values)
    own = from_own.reshape(rows, kv_heads, group * width, own_width) @ value
    out = out + own.reshape(rows, heads, width, dim)
    return out.transpose(1, 2).contiguous()
