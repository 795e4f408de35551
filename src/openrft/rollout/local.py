"""In-process generation with a transformers model and a KV cache.

The ``n`` samples of a prompt share one prefill: each distinct prompt is run through the model once,
its KV cache is repeated ``n`` times, and decoding continues for all samples in one batch. Each
sampled token's log-prob under the temperature-scaled policy is recorded as it is drawn.

On CPU with more than one torch thread, the prompts are split between as many Python threads as torch
threads, each decoding its rows with one torch thread (``row_workers``). A decode step is about a thousand
small ops, and with torch's threads inside each op every op has to wake the other threads: on a 0.5B
model, 64 rows, 2 threads, that gave 82 tokens/s against 94 with the rows split (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial

import torch
from transformers import DynamicCache, PreTrainedModel

from openrft.attention import runs_chunked_sdpa
from openrft.module_mode import eval_mode
from openrft.prefix_attention import PrefixGroups, SharedPrefix, share_prefix
from openrft.rollout.continuous import DecodeSession
from openrft.rollout.kv import cache_keyword, left_pad, prefill
from openrft.rollout.onednn import packed_linears
from openrft.rollout.sampling import sample_tokens
from openrft.rollout.sync_probe import ProbeSet, score_with_model
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams

# Rows that have ended are dropped from the decode batch (their KV cache gathered away) once this
# share of the batch has ended; until then they ride along masked. Measured in docs/performance.md.
COMPACT_FRACTION = 0.25


def row_workers(threads: int, prompts: int, device: torch.device) -> int:
    """How many Python threads share a ``generate`` batch: one per torch thread, at most one per prompt; on CPU only
    (a GPU's kernels are launched from one thread)."""
    return max(1, min(threads, prompts)) if device.type == "cpu" else 1


def split_evenly(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` consecutive runs whose lengths differ by at most one."""
    size, extra = divmod(len(items), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(parts)]


class TransformersGenerator(PolicyVersioned):
    """Generates with a model it shares with the learner (the usual case on one machine): the
    policy version is whatever the learner last set, and ``load_adapter`` copies weights in when
    the model is a separate replica."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer,
        eos_token_ids: list[int],
        pad_token_id: int,
        seed: int = 0,
        max_batch_sequences: int = 256,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = pad_token_id
        self.max_batch_sequences = max_batch_sequences
        self.rng = torch.Generator(device=self.device).manual_seed(seed)
        self._cache_kwarg = cache_keyword(model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def probe_engine(self) -> tuple[str, str]:
        """The engine and dtype whose sync-probe tolerance applies (``rollout/sync_probe.py``)."""
        return "transformers", str(next(self.model.parameters()).dtype).removeprefix("torch.")

    def score(self, probe: ProbeSet) -> list[list[float]]:
        """The probe's continuation log-probs under the model this generator samples from."""
        return score_with_model(self.model, probe)

    def load_adapter(self, weights: dict[str, torch.Tensor], version: int) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.model, weights)
        self._version = version

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        rng = self.stream(seed)
        with eval_mode(self.model), packed_linears(self.model, params.max_new_tokens):
            prompts_per_chunk = max(1, self.max_batch_sequences // params.n)
            results: list[list[Completion]] = []
            for start in range(0, len(prompts), prompts_per_chunk):
                results += self._generate_rows_in_threads(prompts[start : start + prompts_per_chunk], params, rng)
            return results

    @property
    def continuous(self) -> bool:
        """Whether ``decoding`` can run: every layer a plain full-attention KV cache (no sliding windows)."""
        config = self.model.config.get_text_config()
        return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or ["full_attention"])

    @contextmanager
    def decoding(self, params: SamplingParams, seed: int | None = None) -> Iterator[DecodeSession]:
        """A continuous decode batch (``openrft.rollout.continuous``) with the model in eval mode: requests join
        and leave it between decode steps, and a keyed conversation's KV cache is kept across its turns."""
        with eval_mode(self.model):
            session = DecodeSession(self, params, self.stream(seed))
            try:
                yield session
            finally:
                session.store.clear()

    def stream(self, seed: int | None) -> torch.Generator:
        """The random stream of one ``generate`` call: the generator's own, or a fresh one for ``seed``."""
        return self.rng if seed is None else torch.Generator(device=self.device).manual_seed(seed)

    def generate_chunk(
        self, prompts: list[list[int]], params: SamplingParams, rng: torch.Generator
    ) -> list[list[Completion]]:
        """One batch of ``generate`` (the model in eval mode): a caller that holds a lock per batch (the
        generation server) calls it in turns, with one ``stream`` for the whole request."""
        return self._generate_chunk(prompts, params, rng)

    def _generate_rows_in_threads(
        self, prompts: list[list[int]], params: SamplingParams, rng: torch.Generator
    ) -> list[list[Completion]]:
        """``_generate_chunk`` with the prompts split between ``row_workers`` Python threads, each with its share of
        torch's threads and its own random stream drawn from ``rng`` (the same samples for the same thread count)."""
        threads = torch.get_num_threads()
        workers = row_workers(threads, len(prompts), self.device)
        if workers == 1:
            return self._generate_chunk(prompts, params, rng)
        seeds = torch.randint(0, 2**62, (workers,), generator=rng, device=rng.device).tolist()

        def run(part: list[list[int]], seed: int) -> list[list[Completion]]:
            torch.set_num_threads(threads // workers)  # this thread's own OpenMP setting
            with torch.no_grad():  # grad mode is per thread
                return self._generate_chunk(part, params, torch.Generator(device=self.device).manual_seed(seed))

        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="openrft-rows") as pool:
                parts = list(pool.map(run, split_evenly(prompts, workers), seeds))
        finally:
            torch.set_num_threads(threads)  # torch also keeps the count for threads it starts later
        return [group for part in parts for group in part]

    def _end_table(self, vocab: int, device: torch.device, params: SamplingParams) -> torch.Tensor:
        """``table[token]`` is True for end tokens (none with ``ignore_eos``): one indexing op a step, not ``isin``."""
        table = torch.zeros(vocab, dtype=torch.bool, device=device)
        ids = [] if params.ignore_eos else [i for i in self.eos_token_ids if 0 <= i < vocab]
        if ids:
            table[torch.tensor(ids, device=device)] = True
        return table

    def _share_prompts(self, cache: DynamicCache, prompt_mask: torch.Tensor, n: int) -> SharedPrefix | None:
        """The prompts' cache held once for their ``n`` samples each (``prefix_attention.py``), or None."""
        if not runs_chunked_sdpa(self.model):
            return None
        index = torch.arange(prompt_mask.shape[0], device=prompt_mask.device).repeat_interleave(n)
        return share_prefix(self.model.config, cache, partial(PrefixGroups.build, index, prompt_mask), 1, grows=True)

    def _generate_chunk(
        self, prompts: list[list[int]], params: SamplingParams, rng: torch.Generator
    ) -> list[list[Completion]]:
        device = self.device
        ids, mask, positions = (t.to(device) for t in left_pad(prompts, self.pad_token_id))
        logits, cache = prefill(self.model, ids, mask, positions, self._cache_kwarg)
        n, shared = params.n, None
        if n > 1:  # one prefill per prompt, shared by its n samples: held once, or copied onto each
            shared = self._share_prompts(cache, mask, n)
            if shared is None:
                cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            mask = mask.repeat_interleave(n, dim=0)
            positions = positions.repeat_interleave(n, dim=0)
        rows = logits.shape[0]
        next_position = positions[:, -1] + 1
        is_end = self._end_table(logits.shape[-1], device, params)
        limits = [params.completion_limit(len(p)) for p in prompts for _ in range(n)]
        limit = torch.tensor(limits, dtype=torch.long, device=device)  # per row: max_new_tokens within max_length
        steps = max(limits)
        tokens_out = torch.full((rows, steps), self.pad_token_id, dtype=torch.long, device=device)
        logp_out = torch.zeros((rows, steps), dtype=torch.float32, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        stopped = torch.zeros(rows, dtype=torch.bool, device=device)
        row_of = torch.arange(rows, device=device)  # the output row of each row still in the batch
        done = torch.zeros(rows, dtype=torch.bool, device=device)  # ended, not yet dropped from the batch

        for t in range(steps):
            token, logp = sample_tokens(logits, params.temperature, params.top_k, params.top_p, rng, params.min_p)
            logits = None  # only one step's full-vocabulary logits are ever held (long responses, real vocabularies)
            live = row_of[~done]
            tokens_out[live, t] = token[~done]
            logp_out[live, t] = logp[~done]
            lengths[live] += 1
            hit = is_end[token] & ~done
            stopped[row_of[hit]] = True
            done |= hit | (lengths[row_of] >= limit[row_of])
            if t == steps - 1 or bool(done.all()):
                break
            if int(done.sum()) >= COMPACT_FRACTION * done.numel():  # drop ended rows: their compute is wasted
                keep = (~done).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                row_of, token, mask, next_position, done = (x[keep] for x in (row_of, token, mask, next_position, done))
            token = token.masked_fill(done, self.pad_token_id)
            mask = torch.cat([mask, (~done).long().unsqueeze(-1)], dim=-1)
            logits = self.model(
                input_ids=token.unsqueeze(-1),
                attention_mask=mask,
                position_ids=next_position.unsqueeze(-1),
                use_cache=True,
                **{self._cache_kwarg: cache},
            ).logits[:, -1, :]
            next_position = next_position + 1

        if shared is not None:
            shared.check()
        # as Python lists once: indexing the tensors row by row would cost several ops per sample
        tokens_rows, logp_rows = tokens_out.tolist(), logp_out.tolist()
        lengths_list, stopped_list = lengths.tolist(), stopped.tolist()
        results: list[list[Completion]] = []
        for p, prompt in enumerate(prompts):
            group = []
            for row in range(p * n, (p + 1) * n):
                length, stops = lengths_list[row], stopped_list[row]
                token_ids = tokens_rows[row][:length]
                group.append(
                    Completion(
                        prompt_ids=list(prompt),
                        token_ids=token_ids,
                        logprobs=logp_rows[row][:length],
                        text=self.tokenizer.decode(token_ids[:-1] if stops else token_ids, skip_special_tokens=True),
                        finish_reason="stop" if stops else "length",
                        policy_version=self._version,
                    )
                )
            results.append(group)
        return results
