"""The models behind the Tinker routes: one loaded base model per name, shared by every LoRA training
client on it (each client its own PEFT adapter and AdamW), forward/backward with the built-in losses,
gradients accumulated until ``optim_step``, sampling through OpenRFT's in-process generator.

Not thread-safe by design: the routes run every call on one worker thread (``futures.Futures``), each
tenant's in the order its requests arrived (the order the SDK sends a client's requests in), the tenants in
turn.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

from openrft.algo.tinker_losses import (
    LOSSES,
    RECORDED,
    LossInputError,
    check_inputs,
    needs_recording,
    resolve_config,
)
from openrft.engine.phase_threads import PhaseThreads
from openrft.engine.sync_check import SyncProbeError
from openrft.models import configure_threads, eos_token_ids, load_causal_lm, load_tokenizer, resolve_model_path
from openrft.rollout.local import TransformersGenerator
from openrft.rollout.sync_probe import ProbeSet, max_abs_diff, score_with_model, tolerance_for
from openrft.rollout.types import SamplingParams
from openrft.service.tinker import pieces
from openrft.service.tinker.prefix import logprobs as shared_prefix_logprobs
from openrft.service.tinker.prefix import whole_logprobs
from openrft.service.tinker.stability import StabilityRecords

LORA_ALPHA = 32  # Tinker's fixed LoRA alpha: the effective scale alpha / rank
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
UNEMBED = ["lm_head"]
DEFAULT_MAX_TOKENS = 16
KEEP_SNAPSHOTS = 16
# a forward_backward is computed in chunks of about CHUNK_TOKENS tokens (datums together), a longer datum in pieces
# of PIECE_TOKENS along its sequence (pieces.py), other tenants' calls between them: on the demo model and two
# cores no part took more than 0.32 s at the default --tinker-max-sequence-tokens 8192, and another tenant's
# 6-token sample's p99 was 0.49 s (docs/tinker.md, benchmarks/results/tinker_fairness.md)
CHUNK_TOKENS = 1024
PIECE_TOKENS = 512


class UserError(ValueError):
    """A request the API answers with a user error (category ``user``), naming the field and value."""


@dataclass
class LoraSettings:
    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    def peft_config(self, model: torch.nn.Module) -> LoraConfig:
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        wanted = (ATTENTION if self.train_attn else []) + (MLP if self.train_mlp else [])
        if self.train_unembed and not getattr(model.config, "tie_word_embeddings", False):
            wanted += UNEMBED  # a tied head is the embedding: an adapter there would train both
        targets = [t for t in wanted if t in names]
        if not targets:
            raise UserError(f"lora_config trains none of this model's layers (train_mlp/attn/unembed): {wanted}")
        return LoraConfig(r=self.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets, bias="none")


class BaseModel:
    """One base model, loaded once; adapters are added to the one PEFT wrapper by name."""

    def __init__(self, name: str, source: str | None = None):
        self.name = name  # as the client named it (a published name); ``source`` is what loads (default: the name)
        source = source or name
        self.path = resolve_model_path(source)
        self.tokenizer = load_tokenizer(source)
        self.base = load_causal_lm(source, torch.device("cpu"), torch.float32).eval()
        self.peft = None
        self.eos = eos_token_ids(self.tokenizer, self.base)
        self.pad = self.tokenizer.pad_token_id
        self.loaded: dict[str, object] = {}  # scratch adapter -> the snapshot it holds

    @property
    def model(self) -> torch.nn.Module:
        return self.peft if self.peft is not None else self.base

    @property
    def arch(self) -> str:
        return self.base.config.model_type

    @property
    def vocab(self) -> int:
        return self.base.config.vocab_size

    def add_adapter(self, name: str, lora: LoraSettings) -> None:
        config = lora.peft_config(self.base)
        if lora.seed is not None:
            torch.manual_seed(lora.seed)
        if self.peft is None:
            self.peft = get_peft_model(self.base, config, adapter_name=name).eval()
        else:
            self.peft.add_adapter(name, config)
        self.peft.set_adapter(name)

    def activate(self, name: str | None) -> None:
        if name is not None:
            self.peft.set_adapter(name)

    def adapter_parameters(self, name: str) -> list[torch.nn.Parameter]:
        return [p for n, p in self.peft.named_parameters() if f".{name}." in n]

    def state(self, name: str) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.peft, adapter_name=name).items()}

    def load_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        set_peft_model_state_dict(self.peft, state, adapter_name=name)


@dataclass
class TrainingModel:
    model_id: str
    owner: str
    base: BaseModel
    lora: LoraSettings
    optimizer: torch.optim.AdamW
    steps: int = 0
    pending_grads: bool = False
    job_id: str | None = None  # its row in the job store (records.py)
    pending: dict[str, float] = field(default_factory=dict)  # loss, datums, tokens, timings since the last step
    snapshots: list[str] = field(default_factory=list)  # its snapshot samplers, oldest first
    last_step: tuple[float, float] | None = None  # (wall clock, server process CPU) when its last step ended
    adapter_bytes: int = 0  # its adapter's weights (a saved state holds them and AdamW's two moments)


@dataclass
class Sampler:
    sampler_id: str
    owner: str
    base: BaseModel
    adapter: str | None  # the scratch adapter its weights are loaded into; None = the base model
    weights: dict[str, torch.Tensor] | None
    model_path: str | None
    lora: LoraSettings | None = None
    model: TrainingModel | None = None  # the training model it is a snapshot of (its samples count in its steps)
    probe_reference: list[list[float]] | None = None  # the training model's sync-probe scores at the snapshot


def tinker_probe(vocab: int) -> ProbeSet:
    """The sync probe of Tinker samplers (``rollout/sync_probe.py``). A Tinker server holds no job data, so the
    probe is a fixed run of the vocabulary's ids (every 7th from 1: 24 of prompt, 16 scored), the same for
    every model of that vocabulary; an adapter's change moves its log-probs as it moves any text's."""
    ids = [(1 + 7 * i) % vocab for i in range(40)]
    return ProbeSet([ids[:24]], [ids[24:]])


class Engine:
    def __init__(self, sources: dict[str, str] | None = None) -> None:
        self.sources = sources or {}  # published name -> the directory or Hub id it loads (checks.published)
        self.bases: dict[str, BaseModel] = {}
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, Sampler] = {}
        self._lock = threading.Lock()
        self.threads = PhaseThreads(1, enabled=False)  # set when the first model loads
        # the random stream of requests without a seed: one for the server, so calls draw different samples
        self.rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self.stability = StabilityRecords()  # sequences sampled with record_stability_info (stable_reinforce)

    def path_of(self, name: str) -> str:
        """What a model name loads: a published name's directory (or Hub id), else the name resolved."""
        return resolve_model_path(self.sources.get(name, name))

    def base(self, name: str) -> BaseModel:
        source = self.sources.get(name, name)
        key = resolve_model_path(source)  # a registered name and its directory are one model
        with self._lock:
            if not self.bases:
                # as a job chooses them: at most the cores left idle, then sampling and learning each measured
                # on their first calls (engine/phase_threads.py, docs/performance.md)
                self.threads = PhaseThreads(configure_threads(None, measured=True))
            if key not in self.bases:
                self.bases[key] = BaseModel(name, source)
            return self.bases[key]

    # training ------------------------------------------------------------------------------

    def create_model(self, model_id: str, owner: str, base_model: str, lora: LoraSettings) -> TrainingModel:
        base = self.base(base_model)
        base.add_adapter(model_id, lora)
        optimizer = torch.optim.AdamW(base.adapter_parameters(model_id), lr=1e-4, betas=(0.9, 0.95), eps=1e-12)
        model = TrainingModel(model_id, owner, base, lora, optimizer)
        model.adapter_bytes = sum(p.numel() * p.element_size() for p in base.adapter_parameters(model_id))
        self.models[model_id] = model
        return model

    def free_model(self, model_id: str) -> None:
        """Forgets a training client (its session finished): its adapter leaves the base model, its AdamW
        state and its snapshot samplers go with it."""
        model = self.models.pop(model_id, None)
        if model is None:
            return
        for sampler_id in model.snapshots:
            self.samplers.pop(sampler_id, None)
        model.snapshots.clear()
        model.optimizer.state.clear()
        peft = model.base.peft
        if peft is not None and model_id in peft.peft_config:
            active = peft.active_adapter
            peft.delete_adapter(model_id)
            left = list(peft.peft_config)
            if left and active != model_id:
                peft.set_adapter(active)

    def forward_backward(self, model: TrainingModel, loss_fn: str, config, data, backward: bool):
        """The call whole: its outputs and metrics (``forward_backward_steps`` run to the end)."""
        steps = self.forward_backward_steps(model, loss_fn, config, data, backward)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    # where calls run, and the state the routes read and write (the same methods as remote.RayEngine's) ------

    def place(self, client_id: str, owner: str) -> str:
        """The host a new training client or sampler runs on: this process ("") for every one."""
        return ""

    def host_of(self, client) -> str:
        return ""

    def resources_of(self, host: str) -> tuple[float, float]:
        """(CPUs, GPUs) a call computes with here, for its tenant's quota: the threads torch last ran a phase
        with (1 before any), no GPU (the engine runs on the CPU)."""
        return float(max((threads for _, threads in self.threads.last.values()), default=1)), 0.0

    def adapter_state(self, model: TrainingModel) -> dict[str, torch.Tensor]:
        return model.base.state(model.model_id)

    def optimizer_state(self, model: TrainingModel) -> dict:
        return model.optimizer.state_dict()

    def has_moments(self, model: TrainingModel) -> bool:
        return bool(model.optimizer.state)

    def peft_config(self, model: TrainingModel) -> LoraConfig:
        return model.lora.peft_config(model.base.base)

    def load_model_state(self, model: TrainingModel, adapter, optimizer: dict | None, steps: int | None) -> None:
        """A checkpoint's adapter (and AdamW's state and step count, when given) into ``model``; gradients cleared."""
        model.base.load_state(model.model_id, adapter)
        if optimizer is not None:
            model.optimizer.load_state_dict(optimizer)
        if steps is not None:
            model.steps = steps
        model.optimizer.zero_grad(set_to_none=True)

    def new_sampler(
        self, sampler_id: str, owner: str, base_model: str, weights, model_path: str | None, lora: LoraSettings | None
    ) -> Sampler:
        return self.sampler_for(sampler_id, owner, self.base(base_model), weights, model_path, lora)

    def forget_sampler(self, sampler_id: str) -> None:
        self.samplers.pop(sampler_id, None)

    def threads_metrics(self) -> dict[str, float]:
        return self.threads.metrics()

    def check_call(self, owner: str, vocab: int, loss_fn: str, config, data) -> dict:
        return check_call(self.stability, owner, vocab, loss_fn, config, data)

    def forward_backward_steps(
        self, model: TrainingModel, loss_fn: str, config, data, backward: bool, checked: dict | None = None
    ):
        """A generator that computes the call in chunks of at most ``CHUNK_TOKENS`` tokens (a longer datum is a
        chunk of its own, run in pieces along its sequence), yielding between them so that the worker can serve
        other tenants' calls there, and returns ``(outputs, metrics)``. Gradients accumulate chunk by chunk; a
        call that fails (a loss that is not finite) or is stopped between parts (closed: cancel_future, a client
        gone) puts them back as they were before the call. Everything is checked before the first chunk
        (``check_call``; ``checked``: the settings it returned, where it ran already)."""
        if checked is None:
            checked = self.check_call(model.owner, model.base.vocab, loss_fn, config, data)
        settings = checked
        chunks = _chunks(data, CHUNK_TOKENS)
        parts = len(chunks) > 1 or len(chunks[0][0].tokens) > CHUNK_TOKENS
        parameters = model.base.adapter_parameters(model.model_id) if backward and parts else []
        before = [None if p.grad is None else p.grad.clone() for p in parameters]  # undone if the call stops
        logps: list[torch.Tensor] = []
        totals: list[torch.Tensor] = []
        finished = False
        try:
            for i, chunk in enumerate(chunks):
                if i:
                    yield  # another tenant's call may run here (futures.py); this tenant's next call waits
                    self._still_there(model)
                if len(chunk[0].tokens) > CHUNK_TOKENS:  # a chunk of its own, in pieces along its sequence
                    chunk_logps, total = yield from self._long_datum(model, loss_fn, settings, chunk[0], backward)
                else:
                    chunk_logps, total = self._forward_backward(model, loss_fn, settings, chunk, backward)
                logps += chunk_logps
                totals.append(total)
            finished = True
        finally:  # failed, or stopped between parts (cancel_future, a client gone): the gradients as before
            if not finished:
                with torch.no_grad():
                    for p, grad in zip(parameters, before):
                        p.grad = grad
        total = torch.stack(totals).sum()
        if backward:
            model.pending_grads = True
            added = {"loss:sum": float(total), "datums": len(data), "tokens": sum(map(len, logps))}
            for key, value in added.items():
                model.pending[key] = model.pending.get(key, 0.0) + value
        return {"logprobs": logps}, {"loss:sum": float(total)}

    def _still_there(self, model: TrainingModel) -> None:
        if self.models.get(model.model_id) is not model:
            raise UserError(f"training client {model.model_id} was freed (its session finished)")

    def _long_datum(self, model: TrainingModel, loss_fn: str, settings, datum, backward: bool):
        """A generator: one datum longer than ``CHUNK_TOKENS``, in pieces of ``PIECE_TOKENS`` along its sequence
        (pieces.py: the same log-probs, loss and gradient as whole), yielding between pieces; returns as
        ``_forward_backward`` does."""

        def loss_of(logp: torch.Tensor) -> torch.Tensor:
            loss = LOSSES[loss_fn](logp, datum.inputs, settings)
            _check_finite(loss, backward)
            return loss

        model.base.activate(model.model_id)
        steps = pieces.run(
            model.base.model, datum.tokens, datum.inputs["target_tokens"], PIECE_TOKENS, loss_of, backward
        )
        while True:
            with (
                timed(model.pending, "forward_backward" if backward else "forward"),
                self.threads.phase("learn", measured=False),
            ):
                model.base.activate(model.model_id)  # another tenant's call may have activated its own adapter
                try:
                    next(steps)
                except StopIteration as done:
                    logp, loss = done.value
                    return [logp], loss
            yield
            self._still_there(model)

    def _forward_backward(self, model: TrainingModel, loss_fn: str, settings, data, backward: bool):
        """One chunk of a call: its log-probs (detached) and its loss (detached), its gradient accumulated."""
        model.base.activate(model.model_id)
        with (
            timed(model.pending, "forward_backward" if backward else "forward"),
            self.threads.phase("learn", measured=backward) as measure,
            torch.set_grad_enabled(backward),
        ):
            measure.work = sum(len(d.tokens) for d in data)
            logps = shared_prefix_logprobs(
                model.base.model, [d.tokens for d in data], [d.inputs["target_tokens"] for d in data], model.base.pad
            )
            losses = [LOSSES[loss_fn](lp, d.inputs, settings) for lp, d in zip(logps, data)]
            total = torch.stack(losses).sum()
            _check_finite(total, backward)
            if backward:
                total.backward()
        return [lp.detach() for lp in logps], total.detach()

    def optim_step(self, model: TrainingModel, params) -> dict[str, float]:
        with timed(model.pending, "optim_step"):
            return self._optim_step(model, params)

    def _optim_step(self, model: TrainingModel, params) -> dict[str, float]:
        """AdamW's step, refused (``UserError``) when it would leave the adapter or AdamW's moments NaN or
        infinite: they are then restored as they were before the call."""
        parameters = model.base.adapter_parameters(model.model_id)
        if not all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in parameters):
            model.optimizer.zero_grad(set_to_none=True)
            model.pending_grads = False
            raise UserError(
                "optim_step refused: the accumulated gradients hold NaN or inf; they were dropped and the adapter "
                "kept as it was"
            )
        weights = [p.detach().clone() for p in parameters]
        moments = copy.deepcopy(model.optimizer.state_dict())
        for group in model.optimizer.param_groups:
            group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps)
            group["weight_decay"] = params.weight_decay
        metrics: dict[str, float] = {}
        if params.grad_clip_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(parameters, params.grad_clip_norm)
            metrics["grad_norm"] = float(norm)
        model.optimizer.step()
        if not _finite(parameters, model.optimizer):
            with torch.no_grad():
                for p, before in zip(parameters, weights):
                    p.copy_(before)
            model.optimizer.load_state_dict(moments)
            model.optimizer.zero_grad(set_to_none=True)
            model.pending_grads = False
            raise UserError(
                f"optim_step refused: this step (learning_rate {params.learning_rate:g}) would make the adapter or "
                "AdamW's moments NaN or infinite (gradients too large for float32, or a learning_rate too large); "
                "the adapter and AdamW's state were kept as they were and the gradients dropped"
            )
        model.optimizer.zero_grad(set_to_none=True)
        model.steps += 1
        model.pending_grads = False
        return metrics

    def take_pending(self, model: TrainingModel) -> dict[str, float]:
        """What the model's forward_backward calls added up to since the last step, and where the server's time went
        (for its metrics row): ``time/NAME_s`` and ``time/NAME_cpu_s``, the wall and worker-thread CPU seconds of its
        publish, sample, forward_backward and optim_step calls; ``time/step_s`` and ``time/server_cpu_s``, the wall
        time and the whole server process's CPU seconds (HTTP handling included) since its last step."""
        pending, model.pending = model.pending, {}
        now = (time.perf_counter(), time.process_time())
        if model.last_step is not None:
            pending["time/step_s"] = now[0] - model.last_step[0]
            pending["time/server_cpu_s"] = now[1] - model.last_step[1]
        model.last_step = now
        return pending

    # sampling ------------------------------------------------------------------------------

    def sampler_for(
        self, sampler_id: str, owner: str, base: BaseModel, weights, model_path: str | None, lora: LoraSettings | None
    ) -> Sampler:
        adapter = None
        if weights is not None:
            adapter = f"sampler_r{lora.rank}_{int(lora.train_mlp)}{int(lora.train_attn)}{int(lora.train_unembed)}"
            if base.peft is None or adapter not in base.peft.peft_config:
                active = base.peft.active_adapter if base.peft is not None else None
                base.add_adapter(adapter, lora)
                base.activate(active)
        sampler = Sampler(sampler_id, owner, base, adapter, weights, model_path, lora)
        self.samplers[sampler_id] = sampler
        return sampler

    def snapshot_sampler(self, sampler_id: str, model: TrainingModel) -> Sampler:
        """A sampler of the model's current weights (``save_weights_and_get_sampling_client``). These are
        ephemeral, as in Tinker: a model keeps its newest ``KEEP_SNAPSHOTS``, older ones read as not found,
        so a long RL loop does not hold every step's weights."""
        with timed(model.pending, "publish"):
            weights = model.base.state(model.model_id)
            sampler = self.sampler_for(sampler_id, model.owner, model.base, weights, None, model.lora)
            sampler.probe_reference = self._probe_scores(model.base, model.model_id)
        sampler.model = model
        model.snapshots.append(sampler_id)
        while len(model.snapshots) > KEEP_SNAPSHOTS:
            self.samplers.pop(model.snapshots.pop(0), None)
        return sampler

    def _ready(self, sampler: Sampler) -> torch.nn.Module:
        base = sampler.base
        if sampler.adapter is None:
            return base.base if base.peft is None else None
        if base.loaded.get(sampler.adapter) is not sampler.weights:
            base.load_state(sampler.adapter, sampler.weights)
            base.loaded[sampler.adapter] = sampler.weights
            base.activate(sampler.adapter)
            self._check_sync(sampler)
        base.activate(sampler.adapter)
        return base.peft

    def _probe_scores(self, base: BaseModel, adapter: str) -> list[list[float]]:
        """The sync probe scored with ``adapter`` (the active adapter put back after)."""
        active = base.peft.active_adapter
        base.activate(adapter)
        try:
            return score_with_model(base.peft, tinker_probe(base.vocab))
        finally:
            base.activate(active)

    def _check_sync(self, sampler: Sampler) -> None:
        """A snapshot's weights just loaded into the sampling adapter: its probe scores against the training
        model's at the snapshot (``engine/sync_check.py``'s rule: above the tolerance loaded again once, then the
        sample fails naming the sampler); the largest difference is in the training model's next step row."""
        if sampler.probe_reference is None:
            return
        base = sampler.base
        tolerance = tolerance_for("transformers", str(next(base.peft.parameters()).dtype).removeprefix("torch."))
        diff = max_abs_diff(score_with_model(base.peft, tinker_probe(base.vocab)), sampler.probe_reference)
        if diff > tolerance:
            base.load_state(sampler.adapter, sampler.weights)
            diff = max_abs_diff(score_with_model(base.peft, tinker_probe(base.vocab)), sampler.probe_reference)
        if sampler.model is not None:
            pending = sampler.model.pending
            pending["sync/max_logprob_diff"] = max(pending.get("sync/max_logprob_diff", 0.0), diff)
        if diff > tolerance:
            base.loaded.pop(sampler.adapter, None)  # the next request loads it again
            raise SyncProbeError(
                f"Tinker sampler {sampler.sampler_id} (a snapshot of training model "
                f"{sampler.model.model_id if sampler.model else '?'}) samples with log-probs that differ from its "
                f"snapshot's by {diff:.4g} on the sync probe, above the tolerance {tolerance:g}, also after loading "
                "its weights again"
            )

    def check_sample(self, sampler: Sampler, prompt: list[int], params) -> None:
        check_prompt(sampler.base.vocab, prompt, params)

    def sample(self, sampler: Sampler, num_samples: int, params, prompt_logprobs: bool, first, more) -> None:
        """Answers each queued prompt (``Queued.payload``, futures.py) with ``(sequences, prompt log-probs or
        None)`` through its ``deliver``: ``num_samples`` sequences each. The prompts queued together start as
        one batch (one prefill per prompt, shared by its samples) and those that arrive while it decodes
        (``more()``) join it between decode steps (rollout/continuous.py), so a loop's requests, which reach
        the server one by one, neither wait for a batch to end nor run alone. A model with sliding-window
        layers runs each batch whole instead."""
        clock = timed(sampler.model.pending, "sample") if sampler.model is not None else nullcontext()
        with clock, self.threads.phase("generate") as measure:
            self._ready(sampler)
            self._sample(sampler, num_samples, params, prompt_logprobs, first, more, measure)

    def _sample(self, sampler: Sampler, num_samples: int, params, prompt_logprobs: bool, first, more, measure) -> None:
        base = sampler.base
        max_tokens = DEFAULT_MAX_TOKENS if params.max_tokens is None else params.max_tokens
        stop_ids, stop_strings = self._stops(base, params.stop)
        with _adapter_disabled(base, sampler.adapter is None), torch.no_grad():
            model = base.model
            generator = TransformersGenerator(model, base.tokenizer, stop_ids, base.pad)
            generator.rng = self.rng
            sampling = SamplingParams(
                n=num_samples,
                temperature=params.temperature,
                top_k=min(max(0, params.top_k), base.base.config.vocab_size),
                top_p=params.top_p,
                max_new_tokens=max_tokens,
            )

            def answer(prompt: list[int], completions, deliver) -> None:
                lp = None
                if prompt_logprobs:
                    lp = whole_logprobs(model, [prompt], [torch.tensor([*prompt[1:], 0])], base.pad)[0]
                    lp = [float("nan"), *lp[:-1].tolist()]
                measure.work += len(prompt) + sum(len(c.token_ids) for c in completions)
                deliver(([_cut_at_stop_strings(c, stop_strings, base.tokenizer) for c in completions], lp))

            if not generator.continuous:
                groups = generator.generate([q.payload for q in first], sampling, seed=params.seed)
                for q, group in zip(first, groups):
                    answer(q.payload, group, q.deliver)
                return
            with generator.decoding(sampling, seed=params.seed) as session:

                def admit(queued) -> None:
                    for q in queued:
                        done = _Gather(num_samples, lambda completions, q=q: answer(q.payload, completions, q.deliver))
                        session.submit(q.payload, [max_tokens] * num_samples, done.callbacks)

                admit(first)
                while session.busy:
                    session.step()
                    admit(more())

    @staticmethod
    def _stops(base: BaseModel, stop) -> tuple[list[int], list[str]]:
        if stop is None:
            return list(base.eos), []
        if isinstance(stop, str):
            stop = [stop]
        ids = [s for s in stop if isinstance(s, int)]
        strings = []
        for s in stop:
            if isinstance(s, str):
                encoded = base.tokenizer.encode(s, add_special_tokens=False)
                if len(encoded) == 1:
                    ids.append(encoded[0])
                else:
                    strings.append(s)
        return ids, strings


def check_call(stability: StabilityRecords, owner: str, vocab: int, loss_fn: str, config, data) -> dict:
    """A forward_backward's loss configuration, after every datum is checked (and a stable_reinforce datum's
    recorded log-probs resolved into its inputs): before any work, where the stability records are."""
    settings = resolve_config(loss_fn, config)
    if not data:
        raise LossInputError("data is empty: forward_backward needs at least one datum")
    for i, datum in enumerate(data):
        if not datum.tokens:
            raise LossInputError(f"data[{i}].model_input is empty")
        check_inputs(loss_fn, datum.inputs, len(datum.tokens), i)
        if needs_recording(loss_fn):
            datum.inputs[RECORDED] = stability.resolve(
                owner, i, datum.spans, datum.inputs["target_tokens"], datum.inputs["advantages"]
            )
        for name, values in (
            ("model_input", torch.tensor(datum.tokens)),
            ("target_tokens", datum.inputs["target_tokens"]),
        ):
            bad = values[(values < 0) | (values >= vocab)]
            if bad.numel():
                raise LossInputError(f"data[{i}].{name} holds token {int(bad[0])}, outside the vocabulary [0, {vocab})")
    return settings


def check_prompt(vocab: int, prompt: list[int], params) -> None:
    """A sample request's tokens outside the model's vocabulary, before it is queued (a bad one never fails
    a batch); its numbers and sizes are checked before this (``checks.sample``)."""
    bad = [t for t in prompt if not 0 <= t < vocab]
    if not prompt:
        raise UserError("prompt is empty")
    if bad:
        raise UserError(f"prompt holds token {bad[0]}, outside the vocabulary [0, {vocab})")
    if isinstance(params.stop, list | tuple) and any(isinstance(s, int) and not 0 <= s < vocab for s in params.stop):
        raise UserError(f"sampling_params.stop holds a token outside the vocabulary [0, {vocab})")


def _check_finite(loss: torch.Tensor, backward: bool) -> None:
    if backward and not bool(torch.isfinite(loss)):
        raise LossInputError(
            f"the loss is {float(loss.detach())}: not finite, so no gradient was accumulated "
            "(look for extreme weights, advantages or logprobs)"
        )


def _chunks(data: list, tokens: int) -> list[list]:
    """``data`` in consecutive runs of at most ``tokens`` tokens (a longer datum is a run of its own)."""
    chunks: list[list] = [[]]
    size = 0
    for datum in data:
        if chunks[-1] and size + len(datum.tokens) > tokens:
            chunks.append([])
            size = 0
        chunks[-1].append(datum)
        size += len(datum.tokens)
    return chunks


def _finite(parameters: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> bool:
    tensors = [p.detach() for p in parameters]
    tensors += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


@contextmanager
def timed(into: dict[str, float], name: str) -> Iterator[None]:
    """Adds the block's wall seconds to ``into["time/NAME_s"]`` and this thread's CPU seconds to
    ``into["time/NAME_cpu_s"]`` (the worker thread's: torch runs its ops there at one thread)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        for key, value in (
            (f"time/{name}_s", time.perf_counter() - wall),
            (f"time/{name}_cpu_s", time.thread_time() - cpu),
        ):
            into[key] = into.get(key, 0.0) + value


class _Gather:
    """One callback per sample of a request; ``then(completions)`` once all of them have ended, in order."""

    def __init__(self, n: int, then):
        self.slots: list = [None] * n
        self.left, self.then = n, then
        self.callbacks = [self._at(i) for i in range(n)]

    def _at(self, i: int):
        def done(completion) -> None:
            self.slots[i] = completion
            self.left -= 1
            if self.left == 0:
                self.then(self.slots)

        return done


class _adapter_disabled:
    """Sampling the base model of a PEFT-wrapped base: the adapters off for the call."""

    def __init__(self, base: BaseModel, disable: bool):
        self.cm = base.peft.disable_adapter() if disable and base.peft is not None else None

    def __enter__(self):
        if self.cm is not None:
            self.cm.__enter__()

    def __exit__(self, *exc):
        if self.cm is not None:
            self.cm.__exit__(*exc)


def _cut_at_stop_strings(completion, stop_strings: list[str], tokenizer):
    """(tokens, logprobs, stopped): a completion ends at the token that completes a stop string. Found by
    bisection over the prefixes (a prefix's text holds a stop string from the first one that does on), so a
    long completion costs a few decodes, not one per token."""
    from openrft.service.tinker.wire import WireSequence

    tokens, logprobs = list(completion.token_ids), list(completion.logprobs)
    stopped = completion.finish_reason == "stop"

    def holds(end: int) -> bool:
        text = tokenizer.decode(tokens[:end])
        return any(s in text for s in stop_strings)

    if stop_strings and tokens and holds(len(tokens)):
        low, high = 1, len(tokens)  # holds(high)
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if holds(middle) else (middle + 1, high)
        return WireSequence(tokens[:low], logprobs[:low], True)
    return WireSequence(tokens, logprobs, stopped)
