"""What a Tinker request may ask for, checked in the route before anything is queued or changed
(docs/tinker.md, "Bounds", "Published models", "Errors"): each refusal is a ``Refused`` whose message
names the field, the value and what is allowed; 413 when the value is past one of the operator's bounds.

- **Published models only.** A tenant's ``base_model`` is a name the operator published: ``openrft-demo``,
  the names given with ``openrft serve --model NAME=PATH``, and, with ``--allow-hub-models``, Hugging Face
  Hub ids. Never a path on the server. The server's single local operator (loopback, no API keys) may still
  name a model directory.
- **Numbers that can be trained and sampled with**: finite, in range, seeds within 64 bits.
- **Bounded sample requests**: ``num_samples``, the prompt plus ``max_tokens``, and their product.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from openrft.models import REGISTERED_MODELS
from openrft.service.tenancy import is_operator
from openrft.service.tinker.settings import TinkerSettings

# a Hugging Face Hub id: ORG/NAME, no path parts beyond those, no leading dot
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0  # below: the scaled logits overflow float32; 0 is greedy
MAX_STOP = 64  # entries of sampling_params.stop
MAX_STOP_CHARS = 1000  # characters of one stop string


class Refused(ValueError):
    """A request refused before any work; ``status`` 400, or 413 past an operator's bound."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def shown(value, limit: int = 120) -> str:
    """A value as a refusal quotes it: repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def published(settings: TinkerSettings) -> dict[str, str]:
    """Published name -> what the engine loads (a directory or a Hub id)."""
    return {**{name: str(path) for name, path in REGISTERED_MODELS.items()}, **settings.models}


def base_model(settings: TinkerSettings, who: str, name, field: str = "base_model") -> str:
    """``name`` when the caller may train or sample it, else ``Refused`` listing the names they may use."""
    names = published(settings)
    if isinstance(name, str) and name in names:
        return name
    if is_operator(who) and isinstance(name, str) and name:
        return name  # the local operator: a directory or Hub id of their own choosing (models.resolve_model_path)
    available = ", ".join(sorted(names))
    if settings.allow_hub_models:
        available += ", or a Hugging Face Hub id (ORG/NAME)"
        if isinstance(name, str) and HUB_ID.match(name) and ".." not in name and not Path(name).exists():
            return name
    raise Refused(f"{field} {shown(name)} is not a model this server publishes; available: {available}")


def seed(value, field: str) -> None:
    if value is not None and not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise Refused(f"{field} {shown(value)} does not fit in 64 bits: it must be in [-2**63, 2**64 - 1]")


def _number(value, field: str, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
    ok = isinstance(value, int | float) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise Refused(f"{field} {shown(value)} must be a finite number in {interval}")


def adam(params) -> None:
    """AdamParams that AdamW can step with: every one finite and in its range."""
    _number(params.learning_rate, "optim_params.learning_rate", 0, 1e3)
    _number(params.beta1, "optim_params.beta1", 0, 1, high_open=True)
    _number(params.beta2, "optim_params.beta2", 0, 1, high_open=True)
    _number(params.eps, "optim_params.eps", 0, 1, low_open=True)
    _number(params.weight_decay, "optim_params.weight_decay", 0, 1e3)
    _number(params.grad_clip_norm, "optim_params.grad_clip_norm", 0, math.inf, high_open=True)


def lora(config) -> None:
    seed(config.seed, "lora_config.seed")


def sample(settings: TinkerSettings, num_samples: int, prompt_tokens: int, params, default_max_tokens: int) -> None:
    """A sample request within the operator's bounds, with values the sampler can use."""
    if not 1 <= num_samples <= settings.max_num_samples:
        status = 413 if num_samples > settings.max_num_samples else 400
        raise Refused(f"num_samples {shown(num_samples)} must be in [1, {settings.bound('max_num_samples')}]", status)
    t = params.temperature
    if not (isinstance(t, int | float) and math.isfinite(t) and (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE)):
        raise Refused(
            f"sampling_params.temperature {shown(t)} must be 0 (greedy) or a finite number in "
            f"[{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]"
        )
    _number(params.top_p, "sampling_params.top_p", 0, 1, low_open=True)
    if not -1 <= params.top_k < 2**31:
        raise Refused(f"sampling_params.top_k {shown(params.top_k)} must be -1 (no limit), 0 (no limit) or positive")
    seed(params.seed, "sampling_params.seed")
    stop = params.stop
    if isinstance(stop, list | tuple):
        if len(stop) > MAX_STOP:
            raise Refused(f"sampling_params.stop has {len(stop)} entries; at most {MAX_STOP}")
        for i, s in enumerate(stop):
            if isinstance(s, int) and not 0 <= s < 2**31:
                raise Refused(f"sampling_params.stop[{i}] {shown(s)} is not a token id")
    strings = [stop] if isinstance(stop, str) else [s for s in stop or () if isinstance(s, str)]
    if any(len(s) > MAX_STOP_CHARS or not s for s in strings):
        raise Refused(f"sampling_params.stop: a stop string must have 1 to {MAX_STOP_CHARS} characters")
    max_tokens = default_max_tokens if params.max_tokens is None else params.max_tokens
    if max_tokens < 1:
        raise Refused(f"sampling_params.max_tokens {shown(max_tokens)} must be >= 1")
    most = settings.max_sequence_tokens
    if prompt_tokens + max_tokens > most:
        raise Refused(
            f"sampling_params.max_tokens {shown(max_tokens)} with a prompt of {prompt_tokens} tokens is past the "
            f"bound of {settings.bound('max_sequence_tokens')} tokens per sequence (prompt plus max_tokens)",
            413,
        )
    total = num_samples * (prompt_tokens + max_tokens)
    if total > settings.max_sample_tokens:
        raise Refused(
            f"num_samples {num_samples} x (prompt {prompt_tokens} + max_tokens {max_tokens}) = {total} tokens is "
            f"past the bound of {settings.bound('max_sample_tokens')} tokens per sample request",
            413,
        )
