"""The Tinker engine on the server's Ray cluster (``openrft serve --ray-address``): training clients and samplers
live in ``TinkerHost`` actors (host_actor.py), one per node and placed there, each base model loaded once per
actor and a LoRA adapter per client, at most ``--tinker-clients-per-actor`` clients on one; a new client goes to
the node with the fewest, so the clients of different tenants compute on different nodes at the same time (the
routes queue each actor's calls on a worker of its own: futures.py, ``host``).

``RayEngine`` answers the routes as ``engine.Engine`` does (the same methods; routes.py does not know which it
has): the records of clients and samplers (owner, ids, steps, the base model's name) stay in the server, with
the checks that come before any work (bounds, vocabulary, stable_reinforce's recorded log-probs: ``check_call``),
and every computation is a call to the client's actor. A ``forward_backward`` runs there part by part, so it can
be stopped between parts (cancel_future, a client gone) as in-process."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from openrft.service.tinker.engine import KEEP_SNAPSHOTS, LoraSettings, UserError, check_call, check_prompt
from openrft.service.tinker.settings import TinkerSettings
from openrft.service.tinker.stability import StabilityRecords

log = logging.getLogger("openrft.tinker")
ACTOR_CPUS = 1  # each node's TinkerHost holds one CPU of the cluster while the server runs
ACTOR_NAME = "TinkerHost"  # the actor class Ray's state API lists
PLACING_S = 600.0  # a place() not followed by its client's creation within this long no longer counts


@dataclass
class RemoteBase:
    """What the routes read of a client's base model."""

    name: str
    path: str
    arch: str
    vocab: int


@dataclass
class RemoteModel:
    model_id: str
    owner: str
    base: RemoteBase
    lora: LoraSettings
    host: str  # the node id of its actor
    adapter_bytes: int = 0
    steps: int = 0
    job_id: str | None = None
    moments: bool = False  # AdamW has state (a step taken, or one loaded)
    pending: dict[str, float] = field(default_factory=dict)  # take_pending's row, from the actor's optim_step
    snapshots: list[str] = field(default_factory=list)


@dataclass
class RemoteSampler:
    sampler_id: str
    owner: str
    base: RemoteBase
    model_path: str | None
    host: str
    model: RemoteModel | None = None


def _get(ref) -> Any:
    """``ray.get``, with the actor's own exception raised as it was (a user error keeps its message, without
    Ray's remote traceback), and a lost actor as a server error."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(ref)
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise
    except RayActorError as exc:
        raise RuntimeError("the node hosting this Tinker client was lost; create the client again") from exc


class RayEngine:
    def __init__(self, sources: dict[str, str], settings: TinkerSettings, address: str) -> None:
        from openrft.service.admission import connect

        self.ray = connect(address)
        self.sources = sources
        self.per_actor = settings.clients_per_actor
        self.models: dict[str, RemoteModel] = {}
        self.samplers: dict[str, RemoteSampler] = {}
        self.stability = StabilityRecords()
        self._actors: dict[str, Any] = {}  # node id -> its TinkerHost
        self._placing: dict[str, tuple[str, float]] = {}  # client id -> (node id, when) until it is made
        self._lock = threading.Lock()

    def path_of(self, name: str) -> str:
        from openrft.models import resolve_model_path

        return resolve_model_path(self.sources.get(name, name))

    # placement ----------------------------------------------------------------------------------

    def _nodes(self) -> list[str]:
        return [
            n["NodeID"]
            for n in self.ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= ACTOR_CPUS
        ]

    def _load(self) -> dict[str, int]:
        """Clients per node: training clients, sampling sessions (not snapshots) and clients being made."""
        load: dict[str, int] = {}
        now = time.monotonic()
        clients = [m.host for m in self.models.values()]
        clients += [s.host for s in self.samplers.values() if s.model is None]
        clients += [host for host, when in self._placing.values() if now - when < PLACING_S]
        for host in clients:
            load[host] = load.get(host, 0) + 1
        return load

    def place(self, client_id: str, owner: str) -> str:
        """The node a new client will run on: the one with the fewest clients (its actor made when first used);
        a ``UserError`` naming the bound when every node's actor is full."""
        with self._lock:
            nodes = self._nodes()
            load = self._load()
            free = [n for n in nodes if load.get(n, 0) < self.per_actor]
            if not free:
                raise UserError(
                    f"every Tinker actor of the server's cluster is full: {len(nodes)} nodes x {self.per_actor} "
                    "clients (--tinker-clients-per-actor); finish a session to free its clients, or try again later"
                )
            node = min(free, key=lambda n: (load.get(n, 0), n not in self._actors))
            self._placing[client_id] = (node, time.monotonic())
            return node

    def host_of(self, client) -> str:
        return client.host

    def resources_of(self, host: str) -> tuple[float, float]:
        """(CPUs, GPUs) a call computes with on ``host``'s actor, for its tenant's quota: what the actor holds."""
        return float(ACTOR_CPUS), 0.0

    def actor_nodes(self) -> list[str]:
        """The nodes with a TinkerHost actor (the dashboard's cluster view)."""
        with self._lock:
            return list(self._actors)

    def _actor(self, node: str):
        with self._lock:
            actor = self._actors.get(node)
            if actor is None:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                from openrft.service.tinker.host_actor import TinkerHost

                options = {
                    "num_cpus": ACTOR_CPUS,
                    "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
                    "max_restarts": 0,
                }
                actor = self.ray.remote(TinkerHost).options(**options).remote(self.sources)
                self._actors[node] = actor
            return actor

    def _host_for(self, client_id: str, owner: str) -> str:
        with self._lock:
            placed = self._placing.get(client_id)
        return placed[0] if placed is not None else self.place(client_id, owner)

    # training clients -----------------------------------------------------------------------------

    def create_model(self, model_id: str, owner: str, base_model: str, lora: LoraSettings) -> RemoteModel:
        host = self._host_for(model_id, owner)
        try:
            info = _get(self._actor(host).create_model.remote(model_id, owner, base_model, lora))
        finally:
            self._placing.pop(model_id, None)
        adapter_bytes = info.pop("adapter_bytes")
        model = RemoteModel(model_id, owner, RemoteBase(**info), lora, host, adapter_bytes)
        self.models[model_id] = model
        return model

    def free_model(self, model_id: str) -> None:
        model = self.models.pop(model_id, None)
        if model is None:
            return
        for sampler_id in model.snapshots:
            self.samplers.pop(sampler_id, None)
        model.snapshots.clear()
        _get(self._actor(model.host).free_model.remote(model_id))

    def check_call(self, owner: str, vocab: int, loss_fn: str, config, data) -> dict:
        return check_call(self.stability, owner, vocab, loss_fn, config, data)

    def forward_backward_steps(self, model: RemoteModel, loss_fn: str, config, data, backward: bool):
        """As ``Engine.forward_backward_steps``: checked here, computed on the client's actor a part a turn."""
        settings = self.check_call(model.owner, model.base.vocab, loss_fn, config, data)
        actor = self._actor(model.host)
        call_id = uuid.uuid4().hex
        done, value = _get(actor.start.remote(call_id, model.model_id, loss_fn, config, data, backward, settings))
        try:
            while not done:
                yield
                if self.models.get(model.model_id) is not model:
                    raise UserError(f"training client {model.model_id} was freed (its session finished)")
                done, value = _get(actor.step.remote(call_id))
        finally:
            if not done:  # stopped between parts or failed: the actor's engine puts the gradients back
                _get(actor.close.remote(call_id))
        return value

    def optim_step(self, model: RemoteModel, params) -> dict[str, float]:
        metrics, pending, steps = _get(self._actor(model.host).optim_step.remote(model.model_id, params))
        model.pending, model.steps, model.moments = pending, steps, True
        return metrics

    def take_pending(self, model: RemoteModel) -> dict[str, float]:
        pending, model.pending = model.pending, {}
        return pending

    def threads_metrics(self) -> dict[str, float]:
        return {}  # each actor chooses its own threads; a step's row has no single count to show

    def adapter_state(self, model: RemoteModel) -> dict:
        return _get(self._actor(model.host).adapter_state.remote(model.model_id))

    def optimizer_state(self, model: RemoteModel) -> dict:
        return _get(self._actor(model.host).optimizer_state.remote(model.model_id))

    def has_moments(self, model: RemoteModel) -> bool:
        return model.moments

    def peft_config(self, model: RemoteModel):
        return _get(self._actor(model.host).peft_config.remote(model.model_id))

    def load_model_state(self, model: RemoteModel, adapter, optimizer: dict | None, steps: int | None) -> None:
        _get(self._actor(model.host).load_model_state.remote(model.model_id, adapter, optimizer, steps))
        if optimizer is not None:
            model.moments = bool(optimizer.get("state"))
        if steps is not None:
            model.steps = steps

    # samplers ---------------------------------------------------------------------------------------

    def snapshot_sampler(self, sampler_id: str, model: RemoteModel) -> RemoteSampler:
        _get(self._actor(model.host).snapshot_sampler.remote(sampler_id, model.model_id))
        sampler = RemoteSampler(sampler_id, model.owner, model.base, None, model.host, model)
        self.samplers[sampler_id] = sampler
        model.snapshots.append(sampler_id)
        while len(model.snapshots) > KEEP_SNAPSHOTS:  # the actor's engine forgets the same ones
            self.samplers.pop(model.snapshots.pop(0), None)
        return sampler

    def new_sampler(
        self, sampler_id: str, owner: str, base_model: str, weights, model_path: str | None, lora: LoraSettings | None
    ) -> RemoteSampler:
        host = self._host_for(sampler_id, owner)
        try:
            info = _get(self._actor(host).new_sampler.remote(sampler_id, owner, base_model, weights, model_path, lora))
        finally:
            self._placing.pop(sampler_id, None)
        sampler = RemoteSampler(sampler_id, owner, RemoteBase(**info), model_path, host)
        self.samplers[sampler_id] = sampler
        return sampler

    def forget_sampler(self, sampler_id: str) -> None:
        sampler = self.samplers.pop(sampler_id, None)
        if sampler is not None:
            _get(self._actor(sampler.host).forget_sampler.remote(sampler_id))

    def check_sample(self, sampler: RemoteSampler, prompt: list[int], params) -> None:
        check_prompt(sampler.base.vocab, prompt, params)

    def sample(self, sampler: RemoteSampler, num_samples: int, params, prompt_logprobs: bool, first, more) -> None:
        """The prompts queued together as one batch on the sampler's actor (those arriving meanwhile run in the
        next batch: ``more`` is not taken)."""
        prompts = [q.payload for q in first]
        ref = self._actor(sampler.host).sample.remote(sampler.sampler_id, num_samples, params, prompt_logprobs, prompts)
        for q, answer in zip(first, _get(ref)):
            q.deliver(answer)
