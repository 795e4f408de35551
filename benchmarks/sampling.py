"""Drawing the next token at a real vocabulary: OpenRFT's two-level inverse-CDF sampler against
``torch.multinomial`` (what it replaced, and what Hugging Face ``generate`` runs), side by side in one process.

Both draw from the same temperature-1 logits ``[rows, 151,936]`` and return the chosen tokens' log-probs; the
multinomial path is the sampler as it was before (log-softmax, softmax, ``torch.multinomial``, gather).
"""

from __future__ import annotations

import statistics

import torch

from benchmarks.common import time_calls
from openrft.rollout.sampling import sample_tokens, scaled_log_probs

VOCAB = 151_936


def multinomial_tokens(logits: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logp = scaled_log_probs(logits, 1.0)
    tokens = torch.multinomial(logp.softmax(-1), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def compare(row_counts: list[int], thread_counts: list[int], repeats: int) -> list[dict]:
    """One row per (rows, threads): median ms per draw of each sampler and their ratio."""
    results = []
    before = torch.get_num_threads()
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for rows in row_counts:
                logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows))
                generator = torch.Generator().manual_seed(0)
                ours = time_calls(lambda x=logits, g=generator: sample_tokens(x, 1.0, 0, 1.0, g), repeats)
                theirs = time_calls(lambda x=logits, g=generator: multinomial_tokens(x, g), repeats)
                ms_ours, ms_theirs = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
                results.append(
                    {
                        "rows": rows,
                        "threads": threads,
                        "inverse_cdf_ms": round(ms_ours, 2),
                        "multinomial_ms": round(ms_theirs, 2),
                        "speed_up": round(ms_theirs / ms_ours, 1),
                    }
                )
    finally:
        torch.set_num_threads(before)
    return results
