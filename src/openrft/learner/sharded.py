"""A learner sharded over N processes with FSDP2 (``rollout.learner_sharding: fsdp``).

The N processes (Ray actors, or ``torchrun`` ranks) form one ``torch.distributed`` process group
(gloo on CPU, NCCL on GPU). Every decoder layer and the model around them are ``fully_shard``-ed
(FSDP2), so between steps each process holds 1/N of the parameters, of the gradients and of the
AdamW state; the same for LoRA (the frozen base weights and the adapters are sharded alike) and for
full fine-tuning.

One step, on every process at once:

1. every FSDP unit gathers its parameters once (``unshard``, an all-gather);
2. the process runs the unchanged ``Learner.accumulate`` over its share of the global batch, each
   micro-batch's token sum divided by the **global** batch's response tokens, gradients accumulated
   unreduced (``set_requires_gradient_sync(False)``), so the processes need not run the same number
   or shape of micro-batches;
3. one zero-weighted forward/backward of a single token, the same on every process, triggers FSDP's
   reduce-scatter of the accumulated gradient (summed, not averaged: the loss is already normalised
   by the global token count), and the parameters are resharded;
4. clipping (the global norm over the shards) and the AdamW step run on the local shards.

The update is the one a single learner makes on the whole batch (tests/core/test_sharded.py).
The price of step 1 is that a process holds the full parameters and gradients during the passes
(not between them): parameters, gradients and optimizer state between steps are 1/N, the memory
during a step is the full model plus its gradient (docs/scaling.md).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from openrft.learner.learner import (
    SUM_KEYS,
    Learner,
    LearnerConfig,
    add_sums,
    mini_batches,
    response_tokens,
    step_metrics,
    trained,
)
from openrft.learner.policy import Policy
from openrft.spec.job import LoraSpec

SHARDING_MODES = ("none", "fsdp")


def init_process_group(rank: int, world_size: int, address: str, port: int, device: torch.device) -> None:
    """Join the learners' process group: NCCL on CUDA devices, gloo otherwise."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world_size)


def init_from_env(device: torch.device) -> None:
    """Join the process group ``torchrun`` describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...)."""
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that each become an FSDP unit: the model's repeated blocks (``_no_split_modules``,
    the decoder layers of a Hugging Face model), then the model itself (embeddings, norm, LM head)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    block_names = set(getattr(base, "_no_split_modules", None) or ())
    blocks = [m for m in base.modules() if type(m).__name__ in block_names]
    if not blocks:
        raise ValueError(
            f"cannot shard {type(base).__name__}: it names no repeated blocks (_no_split_modules); "
            "rollout.learner_sharding fsdp needs a Hugging Face decoder model"
        )
    return [*blocks, base]


def shard(model: torch.nn.Module, device: torch.device) -> list[FSDPModule]:
    """``fully_shard`` the model's blocks and the model over the process group's ranks.

    ``reshard_after_forward=False``: the parameters gathered at the start of a step stay gathered
    through every micro-batch's forward and backward pass; the learner reshards them explicitly.
    """
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    units = shard_units(model)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=False)
    return units  # type: ignore[return-value]  # fully_shard made each an FSDPModule


def full_tensors(state: dict[str, torch.Tensor], keep: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor whole, on the CPU: an all-gather of each sharded one in turn (a collective: every rank
    calls it), so a device holds one gathered tensor at a time. ``keep`` False: take part, keep nothing."""
    whole = {}
    for name, tensor in state.items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if keep:
            whole[name] = full.detach().to("cpu", copy=True)
    return whole


class ShardedPolicy(Policy):
    """The policy with its model (and a full fine-tune's reference copy) sharded by FSDP2.

    With LoRA the reference adapter is created before sharding (holding the policy's initial adapter,
    unused until the first refit), since FSDP cannot take parameters added later.
    """

    def __init__(self, base_model: torch.nn.Module, lora: LoraSpec, need_reference: bool, device: torch.device):
        super().__init__(base_model, lora, need_reference)
        if need_reference and self.lora_enabled:
            self._load_reference_adapter(self.adapter_state())
            self._reference_is_base = True
        self.units = shard(self.model, device)
        if self._reference_model is not None:
            self.units += shard(self._reference_model, device)

    def adapter_state(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """The policy's weights, gathered whole on the CPU (every rank must call it; ``keep``: see full_tensors)."""
        return full_tensors(Policy.adapter_state(self), keep)

    def local_adapter_state(self) -> dict[str, torch.Tensor]:
        return Policy.adapter_state(self)

    def refit_reference(self) -> None:
        if not self.need_reference or not hasattr(self, "units"):  # Policy.__init__, before sharding
            super().refit_reference()
            return
        if self.lora_enabled:
            self._load_reference_adapter(self.local_adapter_state())  # shard to shard, the same layout
        else:
            with torch.no_grad():
                for ref, param in zip(self._reference_model.parameters(), self.model.parameters(), strict=True):
                    ref.copy_(param)
        self._reference_is_base = False

    def unshard(self) -> None:
        for unit in self.units:
            unit.unshard()

    def reshard(self) -> None:
        for unit in self.units:
            unit.reshard()

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Parameters gathered inside (e.g. for generation), resharded after."""
        self.unshard()
        try:
            yield
        finally:
            self.reshard()


class ShardedLearner(Learner):
    """One process's part of a sharded learner; every rank calls the same methods in the same order."""

    policy: ShardedPolicy

    def __init__(self, policy: ShardedPolicy, config: LearnerConfig):
        super().__init__(policy, config)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        for unit in policy.units:
            unit.set_gradient_divide_factor(1.0)  # sum: each share is already divided by the global tokens
            unit.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)

    def share(self, samples: list) -> list:
        """This rank's contiguous share of the global batch (the data-parallel runtime's split)."""
        size = math.ceil(len(samples) / self.world_size)
        return samples[self.rank * size : (self.rank + 1) * size]

    def step(self, samples: list) -> dict[str, float]:
        """``Learner.step`` over the ranks: every rank is given the whole batch, splits it into the same
        mini-batches (``algorithm.ppo_mini_batches``) and trains on its share of each; one optimizer
        update per mini-batch, each normalised by that mini-batch's tokens over all ranks."""
        total_tokens = response_tokens(samples)
        minis = [m for m in mini_batches(samples, self.config.algorithm.ppo_mini_batches) if trained(m)]
        later = [s for mini in minis[1:] for s in mini]
        if any(s.behaviour_logp is None for s in later):  # the same on every rank: the whole batch decides
            with self.policy.gathered():  # forwards only: each rank records the old log-probs of its shares
                self.record_old_logp([s for mini in minis[1:] for s in self.share(mini)])
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        norms = []
        for mini in minis:
            add_sums(sums, self.accumulate_share(self.share(mini), response_tokens(mini)))
            norms.append(self.apply_update())
        self.end_step()
        totals = torch.tensor([sums[key] for key in SUM_KEYS], dtype=torch.float64)
        dist.all_reduce(totals)
        sums = dict(zip(SUM_KEYS, totals.tolist(), strict=True))
        lr = self.optimizer.param_groups[0]["lr"]
        return step_metrics(sums, total_tokens, sum(norms) / len(norms), lr, self.use_kl, len(minis))

    def accumulate_share(self, samples: list, total_tokens: int) -> dict[str, float]:
        """The gradient of this rank's ``samples`` (``total_tokens``: all ranks'), summed over the ranks
        into each rank's shard; this rank's loss sums."""
        units = self.policy.units
        self.policy.unshard()
        try:
            for unit in units:
                unit.set_requires_gradient_sync(False, recurse=False)
                unit.set_reshard_after_backward(False, recurse=False)
            sums = self.accumulate(samples, total_tokens) if samples else dict.fromkeys(SUM_KEYS, 0.0)
            for unit in units:  # the reducing pass frees each unit's gathered weights once its gradient is reduced
                unit.set_requires_gradient_sync(True, recurse=False)
                unit.set_reshard_after_backward(True, recurse=False)
            self._reduce_gradients()
        finally:
            self.policy.reshard()
        return sums

    def _reduce_gradients(self) -> None:
        """One backward pass, the same on every rank, that only carries FSDP's post-backward hooks: each
        unit then reduce-scatters its accumulated gradient. The weights take no gradient in it (their
        ``requires_grad`` is off, a zero input embedding carries the pass), so it adds no full-size
        gradient; a rank without samples sends zeros."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # the gathered ones, in a step
        for param in trainable:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            param.requires_grad_(False)
        try:
            weight = self.model.get_input_embeddings().weight
            embeds = torch.zeros((1, 1, weight.shape[1]), dtype=weight.dtype, device=weight.device, requires_grad=True)
            logits = self.model(inputs_embeds=embeds).logits
            (logits.float().sum() * 0.0).backward()
        finally:
            for param in trainable:
                param.requires_grad_(True)

    # checkpoint state: torch.distributed.checkpoint files, reshardable ------------------------------

    def _dcp_state(self) -> dict:
        """The sharded tensors of a checkpoint, by parameter name (so any sharding loads them): the
        trained weights (the adapters only, with LoRA), AdamW's moments, a full fine-tune's reference.
        The tensors are the live ones: loading a checkpoint writes into them."""
        model_state = dict(self.model.state_dict(keep_vars=True))
        if self.policy.lora_enabled:  # the frozen base weights are the model's own, not training state
            model_state = {k: v for k, v in model_state.items() if ".lora_" in k}
        names = {id(p): n for n, p in self.model.named_parameters()}
        optimizer = {names[id(p)]: dict(state) for p, state in self.optimizer.state.items()}
        state = {"model": model_state, "optimizer": optimizer}
        if self.policy._reference_model is not None:
            state["reference"] = dict(self.policy._reference_model.state_dict(keep_vars=True))
        return state

    def state_dict(self) -> dict:
        """This rank's files of a ``torch.distributed.checkpoint`` (``{name: bytes}``) and the small
        replicated state; the files of all ranks together load on any number of ranks."""
        import torch.distributed.checkpoint as dcp

        with tempfile.TemporaryDirectory() as tmp:
            dcp.save(self._dcp_state(), checkpoint_id=tmp)
            dist.barrier()
            files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
        return {
            "format": "torch.distributed.checkpoint",
            "files": files,
            "version": self.version,
            "lr": [group["lr"] for group in self.optimizer.param_groups],
            "scheduler": self.scheduler.state_dict(),
            "reference_is_base": self.policy._reference_is_base,
        }

    def load_state_dict(self, state: dict) -> None:
        import torch.distributed.checkpoint as dcp

        if state.get("format") != "torch.distributed.checkpoint":
            raise ValueError(
                "this checkpoint was written by an unsharded learner; resume it with rollout.learner_sharding none"
            )
        self._init_optimizer_state()
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in state["files"].items():
                (Path(tmp) / name).write_bytes(data)
            with torch.no_grad():
                dcp.load(self._dcp_state(), checkpoint_id=tmp)  # in place, resharded to this group
            dist.barrier()
        for group, lr in zip(self.optimizer.param_groups, state["lr"], strict=True):
            group["lr"] = lr
        self.policy._reference_is_base = bool(state["reference_is_base"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])

    def _init_optimizer_state(self) -> None:
        """AdamW creates its state at the first step; a checkpoint loads into existing state, so take a
        step of zero learning rate on zero gradients (the loaded state then replaces it)."""
        if self.optimizer.state:
            return
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        for group in self.optimizer.param_groups:
            group["lr"] = 0.0
        for param in self.policy.trainable_parameters():
            param.grad = torch.zeros_like(param)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_address() -> str:
    """This node's address as the other learners reach it (``OPENRFT_MASTER_ADDR`` overrides)."""
    if os.environ.get("OPENRFT_MASTER_ADDR"):
        return os.environ["OPENRFT_MASTER_ADDR"]
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # not on Ray: this host
        return "127.0.0.1"
