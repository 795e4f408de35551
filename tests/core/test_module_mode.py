"""openrft.module_mode: the same modes as ``model.train(mode)``, and ``train`` itself where a module adds to it."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from transformers import PreTrainedModel

from openrft.module_mode import eval_mode, set_training
from tests.tiny_models import tiny_qwen2


def lora_model() -> torch.nn.Module:
    model = tiny_qwen2(vocab_size=40, max_position_embeddings=32)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"]))


def modes(model: torch.nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


def test_every_module_gets_the_mode_train_gives_it():
    model = lora_model().train()
    assert any(isinstance(m, torch.nn.Dropout) for m in model.modules())  # LoRA's dropout: a mode that matters
    set_training(model, False)
    assert not any(modes(model))
    set_training(model, True)
    assert all(modes(model))


def test_dropout_is_off_in_eval_mode_and_back_on_after_it():
    model = lora_model().train()
    dropout = torch.nn.Dropout(0.5)
    model.add_module("extra_dropout", dropout)
    x = torch.ones(1000)
    with eval_mode(model):
        assert torch.equal(dropout(x), x)
    assert not torch.equal(dropout(x), x)  # training mode again: half the values dropped


def test_eval_mode_leaves_a_model_in_eval_mode_as_it_was():
    model = lora_model().eval()
    with eval_mode(model):
        pass
    assert not any(modes(model))


class CountingTrain(torch.nn.Linear):
    """A module whose ``train`` does more than set the flag."""

    calls = 0

    def train(self, mode: bool = True):
        CountingTrain.calls += 1
        return super().train(mode)


def test_a_module_that_adds_to_train_gets_train_called():
    model = lora_model().train()
    model.add_module("counting", CountingTrain(2, 2))
    CountingTrain.calls = 0
    with eval_mode(model):
        assert not any(modes(model))
    assert CountingTrain.calls == 2
    assert all(modes(model))


def test_transformers_train_is_called_only_with_hub_kernels_on(monkeypatch):
    calls = []

    def spy(self, mode=True):  # PreTrainedModel.train re-kernelizes with Hub kernels on
        calls.append(mode)
        return torch.nn.Module.train(self, mode)

    monkeypatch.setattr(PreTrainedModel, "train", spy)
    model = tiny_qwen2(vocab_size=40, max_position_embeddings=32)
    calls.clear()
    set_training(model, False)
    assert calls == [] and not any(modes(model))  # kernels off (models.without_hub_kernels): the flags alone
    object.__setattr__(model, "_use_kernels", True)
    assert model.use_kernels
    set_training(model, True)
    assert calls and calls[0] is True and all(modes(model))
