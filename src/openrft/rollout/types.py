"""The generator protocol: prompts as token ids in, completions with behaviour log-probs out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 256
    max_length: int | None = None  # prompt + completion tokens of each sample (Nova's max_length); None = no cap
    ignore_eos: bool = False  # end tokens sampled like any other: every answer runs to its limit (vLLM's ignore_eos)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def completion_limit(self, prompt_tokens: int) -> int:
        """The most tokens a completion of a prompt this long may have: ``max_new_tokens``, and within
        ``max_length`` together with its prompt (at least 1: a prompt that leaves no room is refused earlier)."""
        if self.max_length is None:
            return self.max_new_tokens
        return max(1, min(self.max_new_tokens, self.max_length - prompt_tokens))


class PolicyVersioned:
    """The policy version a generator stamps on its completions, for generators to inherit."""

    _version: int = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def set_policy_version(self, version: int) -> None:
        self._version = version


class WrappedGenerator:
    """A generator that samples through another one (``inner``): its random stream, policy version, adapter loads
    and close are the inner one's. Wrappers (tool episodes, a user's agent) override ``generate``."""

    inner: object

    @property
    def rng(self):
        return self.inner.rng

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def set_policy_version(self, version: int) -> None:
        self.inner.set_policy_version(version)

    def load_adapter(self, weights, version: int) -> None:
        self.inner.load_adapter(weights, version)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


@dataclass
class Completion:
    """One sampled response. ``logprobs[i]`` is log p(token_ids[i]) under the sampling policy's
    temperature-scaled distribution (before top-k/top-p), the quantity the learner recomputes; an engine
    that reports the truncated distribution's (vLLM, ``--logprobs-mode processed_logprobs``) sets
    ``logprobs_truncated`` when truncation was on, and the learner compares on that support.

    A multi-turn rollout (``openrft.tools``) is one Completion: ``token_ids`` hold every turn, tool results
    and chat-template tokens included; ``loss_mask`` is 1 on the tokens the model sampled (0 elsewhere, where
    ``logprobs`` is 0), ``turns`` the messages it added (OpenAI's chat shape) and ``text`` its final answer.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (end token) or "length"
    policy_version: int
    metadata: dict = field(default_factory=dict)
    loss_mask: list[int] | None = None
    turns: list[dict] | None = None
    logprobs_truncated: bool = False  # logprobs are of the top-k/top-p/min-p truncated distribution (vLLM)


class Generator(Protocol):
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in prompt order. With ``seed``, sampling uses a
        fresh random stream from that seed and leaves the generator's own stream untouched."""
        ...

    def load_adapter(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Serve the given adapter weights as policy ``version`` from now on."""
        ...

    @property
    def policy_version(self) -> int: ...
