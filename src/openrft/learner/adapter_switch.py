"""The reference forward's adapter switch, without PEFT's walks of the model.

Around each reference forward the learner makes the reference adapter active (or turns adapters off, before the
first refit) and switches back after. PEFT's ``set_adapter`` and ``disable_adapter_layers`` walk every module,
set ``requires_grad`` on every adapter's parameters both ways, and the learner then walked the parameters again to
refreeze the reference: 2.3 ms a switch on the demo's LoRA model (1.5 ms for the adapters off), against 0.07 ms here
(docs/performance.md, the learner's optimisation table). A forward reads only each
LoRA layer's ``_active_adapter`` and ``_disable_adapters`` (and the tuner's ``active_adapter``), so this switch
sets those on the LoRA layers found once, and puts back exactly what was there: which parameters are trainable
never changes. A model with other tuner modules (``modules_to_save`` wrappers, which hold their own active
adapter) gets PEFT's switch (``None`` from ``layers``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils.other import AuxiliaryTrainingWrapper


class AdapterSwitch:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._layers: list[BaseTunerLayer] | None = None
        self._found = False

    def layers(self) -> list[BaseTunerLayer] | None:
        """The model's LoRA layers, found on the first call (``forget`` after adding an adapter's layers)."""
        if not self._found:
            modules = list(self.model.modules())
            plain = not any(isinstance(m, AuxiliaryTrainingWrapper) for m in modules)
            self._layers = [m for m in modules if isinstance(m, BaseTunerLayer)] if plain else None
            self._found = True
        return self._layers

    def forget(self) -> None:
        self._found = False

    @contextmanager
    def active(self, adapter: str, layers: list[BaseTunerLayer]) -> Iterator[None]:
        """``adapter`` active in every layer for the block."""
        tuner = self.model.base_model
        before = [layer._active_adapter for layer in layers], tuner.active_adapter
        for layer in layers:
            layer._active_adapter = [adapter]
        tuner.active_adapter = adapter
        try:
            yield
        finally:
            for layer, active in zip(layers, before[0], strict=True):
                layer._active_adapter = active
            tuner.active_adapter = before[1]

    @contextmanager
    def disabled(self, layers: list[BaseTunerLayer]) -> Iterator[None]:
        """Every adapter off for the block (the base model's outputs)."""
        before = [layer._disable_adapters for layer in layers]
        for layer in layers:
            layer._disable_adapters = True
        try:
            yield
        finally:
            for layer, state in zip(layers, before, strict=True):
                layer._disable_adapters = state
