"""How many tokens one micro-batch may hold in the memory the learner has.

``training.micro_batch_tokens`` (8,192 by default) suits the demo model, whose activations take about
50 KiB a token; a Qwen2.5-0.5B-shaped model keeps 2.4 MiB a token for backward (measured on all 24
layers with LoRA: the peak grew by 5,171 MiB from 1,064 to 3,192 tokens in one micro-batch), so 8,192 tokens
would need about 20 GiB and the job is killed for memory on a 24 GiB machine. The learner therefore caps the
micro-batch at what fits in half the memory available when it starts (the other half for generation, the
reference pass, the loss and fragmentation). The gradient does not depend on the split (the loss is a token
sum over the whole batch), so the cap changes memory and time, never the result.

The estimate per token and decoder layer is ten hidden-size vectors (the norms' inputs and outputs, queries,
keys, values, the attention output, the projections' inputs) and five intermediate-size ones (gate, up, the
activation, its product, the down projection's input), in the model's dtype: 3.0 MiB on that shape, above
the measured 2.4. With activation checkpointing, one hidden-size vector per layer plus one layer's worth.
"""

from __future__ import annotations

import psutil
import torch

ACTIVATION_SHARE = 0.5  # of the memory available when the learner starts
MIN_TOKENS = 256  # never capped below this (the planner still puts at least one sample in each micro-batch)


def activation_bytes_per_token(model_config, element_size: int, checkpointing: bool) -> int:
    """Estimated bytes kept for backward per token of a micro-batch (``model_config``: a transformers config)."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    hidden = text.hidden_size
    intermediate = getattr(text, "intermediate_size", None) or 4 * hidden
    layers = text.num_hidden_layers
    per_layer = 10 * hidden + 5 * intermediate
    floats = hidden * layers + per_layer if checkpointing else per_layer * layers
    return floats * element_size


def available_bytes(device: torch.device) -> int:
    """Memory free for this process's tensors: the device's free memory on a GPU, else the machine's available RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return int(psutil.virtual_memory().available)


def micro_batch_cap(per_token: int, available: int, sharers: int = 1) -> int:
    """The most tokens a micro-batch may hold: ``ACTIVATION_SHARE`` of the ``available`` memory split between
    ``sharers`` processes (learners on one machine's RAM), at ``per_token`` bytes; never below ``MIN_TOKENS``."""
    return max(int(available * ACTIVATION_SHARE / sharers // max(per_token, 1)), MIN_TOKENS)
