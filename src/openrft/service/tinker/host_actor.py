"""The Ray actor that hosts Tinker training clients and samplers on one node of the server's cluster
(remote.py places them): one in-process ``Engine`` per actor, so each base model is loaded once per actor and
every client on it is a LoRA adapter of its own, as in the server process without a cluster.

A ``forward_backward`` runs in the engine's parts (chunks, pieces of a long datum): ``start`` runs the first
and keeps the call's generator under the caller's id, ``step`` runs the next, ``close`` stops it between two
(the engine puts the gradients back), so that the server's worker for this actor serves other tenants' calls
between the parts, as it does in-process (futures.py). Everything else is one method call."""

from __future__ import annotations

from typing import Any

from openrft.service.tinker.engine import Engine, LoraSettings, UserError
from openrft.service.tinker.futures import Queued


class TinkerHost:
    def __init__(self, sources: dict[str, str]) -> None:
        self.engine = Engine(sources)
        self.calls: dict[str, Any] = {}  # call id -> a running forward_backward's generator

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    # training clients -------------------------------------------------------------------------

    def create_model(self, model_id: str, owner: str, base_model: str, lora: LoraSettings) -> dict:
        model = self.engine.create_model(model_id, owner, base_model, lora)
        return {**_base(model.base), "adapter_bytes": model.adapter_bytes}

    def free_model(self, model_id: str) -> None:
        self.engine.free_model(model_id)

    def start(self, call_id: str, model_id: str, loss_fn: str, config, data, backward: bool, settings) -> tuple:
        model = self._model(model_id)
        self.calls[call_id] = self.engine.forward_backward_steps(model, loss_fn, config, data, backward, settings)
        return self.step(call_id)

    def step(self, call_id: str) -> tuple[bool, Any]:
        """The call's next part: ``(False, None)``, or ``(True, (outputs, metrics))`` after its last."""
        steps = self.calls[call_id]
        try:
            next(steps)
        except StopIteration as done:
            del self.calls[call_id]
            return True, done.value
        except BaseException:
            del self.calls[call_id]
            raise
        return False, None

    def close(self, call_id: str) -> None:
        steps = self.calls.pop(call_id, None)
        if steps is not None:
            steps.close()

    def optim_step(self, model_id: str, params) -> tuple[dict, dict, int]:
        model = self._model(model_id)
        metrics = self.engine.optim_step(model, params)
        return metrics, self.engine.take_pending(model), model.steps

    def adapter_state(self, model_id: str) -> dict:
        return self.engine.adapter_state(self._model(model_id))

    def optimizer_state(self, model_id: str) -> dict:
        return self.engine.optimizer_state(self._model(model_id))

    def peft_config(self, model_id: str):
        return self.engine.peft_config(self._model(model_id))

    def load_model_state(self, model_id: str, adapter, optimizer, steps) -> None:
        self.engine.load_model_state(self._model(model_id), adapter, optimizer, steps)

    def threads_metrics(self) -> dict[str, float]:
        return self.engine.threads_metrics()

    def _model(self, model_id: str):
        model = self.engine.models.get(model_id)
        if model is None:  # freed while the call was in flight (its session finished)
            raise UserError(f"training client {model_id} was freed (its session finished)")
        return model

    # samplers ---------------------------------------------------------------------------------

    def snapshot_sampler(self, sampler_id: str, model_id: str) -> None:
        self.engine.snapshot_sampler(sampler_id, self._model(model_id))

    def new_sampler(self, sampler_id: str, owner: str, base_model: str, weights, model_path, lora) -> dict:
        sampler = self.engine.new_sampler(sampler_id, owner, base_model, weights, model_path, lora)
        return _base(sampler.base)

    def forget_sampler(self, sampler_id: str) -> None:
        self.engine.forget_sampler(sampler_id)

    def sample(self, sampler_id: str, num_samples: int, params, prompt_logprobs: bool, prompts: list) -> list:
        """Each prompt's ``(sequences, prompt log-probs or None)``, the prompts as one batch."""
        sampler = self.engine.samplers.get(sampler_id)
        if sampler is None:
            raise UserError(f"sampling session {sampler_id} was freed")
        answers: list[Any] = [None] * len(prompts)
        queued = [Queued(p, lambda result, i=i: answers.__setitem__(i, result)) for i, p in enumerate(prompts)]
        self.engine.sample(sampler, num_samples, params, prompt_logprobs, queued, list)
        return answers


def _base(base) -> dict:
    return {"name": base.name, "path": str(base.path), "arch": base.arch, "vocab": base.vocab}
