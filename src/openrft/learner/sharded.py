"""A learner sharded over N processes with FSDP2 (``rollout.learner_sharding: fsdp``).

The N processes (Ray actors, or ``torchrun`` ranks) form one ``torch.distributed`` process group
(gloo on CPU, NCCL on GPU). Every decoder layer and the model around them are ``fully_shard``-ed
(FSDP2), so between steps each process holds 1/N of the parameters, of the gradients and of the
AdamW state; the same for LoRA (the frozen base weights and the adapters are sharded alike) and for
full fine-tuning.

One step, on every process at once (the FSDP units of verl, torchtitan: per decoder block):

1. the process runs the unchanged ``Learner.accumulate`` over its share of the global batch, each
   micro-batch's token sum divided by the **global** batch's response tokens;
2. in each forward a block's parameters are all-gathered just before it runs (the next block's
   prefetched) and freed after it (``reshard_after_forward``); in backward each block is gathered
   again and its gradient reduce-scattered (summed: the loss is already normalised by the global
   token count) into the sharded gradient, which accumulates over the micro-batches. Only the root
   unit (embeddings, final norm, LM head: the chunked log-prob head reads its weight after the
   decoder's forward) stays gathered from its forward to the end of its backward;
3. every rank runs the same number of passes of the same kind, since each is a sequence of
   collectives: a rank with fewer micro-batches runs zero-weight padding passes; a pass runs its
   prompts and responses packed in one forward (``learner/packed.py``: each block gathered twice per
   pass, not four times) when every rank's fits, else as a prompt pass plus a continuation, every
   response at least two tokens wide (one masked pad token) so that every rank has both;
4. clipping (the global norm over the shards) and the AdamW step run on the local shards.

The update is the one a single learner makes on the whole batch (tests/core/test_sharded.py). A
process holds 1/N of the parameters, gradients and AdamW state, plus one or two blocks, the root unit
and the activations during the step (docs/scaling.md).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from openrft.learner.batch import TrainSample
from openrft.learner.heap import return_large_frees
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
from openrft.learner.logprobs import backward_in_two, can_chunk, chunk_tokens, prompt_boundary, unwrap
from openrft.learner.packed import fits, packing
from openrft.learner.policy import Policy
from openrft.learner.shared_memory import SharedExchange, use_shared_memory
from openrft.learner.vocab_parallel import VocabParallel
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


def shard(
    model: torch.nn.Module,
    device: torch.device,
    offload: bool = False,
    vocab_parallel: bool = True,
    exchange: SharedExchange | None = None,
) -> list[FSDPModule]:
    """``fully_shard`` the model's blocks and the model over the process group's ranks; the units, the
    root (the model itself: embeddings, final norm, LM head) last.

    Each block is resharded after its forward (gathered again in backward) and prefetches the next
    block's all-gather. The root is not resharded after its forward: the chunked log-prob head reads
    ``lm_head.weight`` after the model's forward returns (and its backward right after); FSDP frees it
    after the root's backward, and the learner after a forward without backward (``reshard_roots``).
    ``offload``: the sharded parameters, gradients and AdamW state live in CPU memory
    (``CPUOffloadPolicy``), copied to the device for each unit's use. On a GPU the units compute in
    bfloat16 and reduce gradients in float32 (``MixedPrecisionPolicy``). ``exchange``: the units gather and
    reduce-scatter through it (CPU ranks on one host, ``openrft.learner.shared_memory``) instead of gloo.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    options: dict = {
        "offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
    }
    if device.type == "cuda":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    units = shard_units(model)
    blocks, root = units[:-1], units[-1]
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=True, **options)
    if vocab_parallel and not offload and VocabParallel.supports(root):  # the embedding matrix by rows
        options["ignored_params"] = set(VocabParallel(root, mesh).parameters())
    fully_shard(root, mesh=mesh, reshard_after_forward=False, **options)
    for block, following in pairwise(blocks):
        block.set_modules_to_forward_prefetch([following])
    for unit in units:
        unit.set_gradient_divide_factor(1.0)  # sum: each share is already divided by the global tokens
        unit.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)
    if exchange is not None:
        use_shared_memory(units, exchange)
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

    def __init__(
        self,
        base_model: torch.nn.Module,
        lora: LoraSpec,
        need_reference: bool,
        device: torch.device,
        offload: bool = False,
    ):
        super().__init__(base_model, lora, need_reference)
        return_large_frees()  # the step's freed buffers do not stay resident (``openrft.learner.heap``)
        if need_reference and self.lora_enabled:
            self._load_reference_adapter(self.adapter_state())
            self._reference_is_base = True
        exchange = SharedExchange.open() if device.type == "cpu" and dist.get_world_size() > 1 else None
        self.transport = "shared_memory" if exchange is not None else dist.get_backend()
        self.units = shard(self.model, device, offload, exchange=exchange)
        self.blocks = self.units[:-1]  # the policy's decoder blocks, in order (the last unit is its root)
        self.roots = [self.units[-1]]  # kept gathered after a forward (``shard``)
        if self._reference_model is not None:
            reference = shard(self._reference_model, device, offload, exchange=exchange)
            self.units += reference
            self.roots.append(reference[-1])

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

    def reshard_roots(self) -> None:
        """Free the root units' gathered parameters after forwards without backward (``shard``: a root
        stays gathered after its forward, for the backward that follows a training pass)."""
        for unit in self.roots:
            unit.reshard()

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Parameters gathered inside and kept so through every forward (rank 0's generation runs
        forwards the other ranks do not), resharded after; the embedding matrix whole too."""
        vocab_parallel = VocabParallel.of(unwrap(self.model).get_output_embeddings())
        for unit in self.units:
            unit.set_reshard_after_forward(False, recurse=False)
        self.unshard()
        try:
            with vocab_parallel.whole() if vocab_parallel is not None else nullcontext():
                yield
        finally:
            for unit in self.units:
                if all(unit is not root for root in self.roots):
                    unit.set_reshard_after_forward(True, recurse=False)
            self.reshard()


class ShardedLearner(Learner):
    """One process's part of a sharded learner; every rank calls the same methods in the same order."""

    policy: ShardedPolicy

    def __init__(self, policy: ShardedPolicy, config: LearnerConfig):
        on_cpu = next(policy.model.parameters()).device.type == "cpu"  # the ranks share one machine's RAM
        super().__init__(policy, config, memory_sharers=dist.get_world_size() if on_cpu else 1)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.packed_passes = 0  # passes run packed (``packed``), for tests and benchmarks

    def share_of(self, samples: list) -> list:
        """This rank's contiguous share of the global batch (the data-parallel runtime's split)."""
        size = math.ceil(len(samples) / self.world_size)
        return samples[self.rank * size : (self.rank + 1) * size]

    def share(self, samples: list) -> list:
        """``share_of``, every response at least two tokens wide (``widened``)."""
        return [widened(s, self.config.pad_token_id) for s in self.share_of(samples)]

    def step(self, samples: list) -> dict[str, float]:
        """``Learner.step`` over the ranks: every rank is given the whole batch, splits it into the same
        mini-batches (``algorithm.ppo_mini_batches``) and trains on its share of each; one optimizer
        update per mini-batch, each normalised by that mini-batch's tokens over all ranks."""
        total_tokens = response_tokens(samples)
        minis = [m for m in mini_batches(samples, self.config.algorithm.ppo_mini_batches) if trained(m)]
        self.padding = padding_sample(samples[0], self.config.pad_token_id)
        later = [s for mini in minis[1:] for s in mini]
        if any(s.behaviour_logp is None for s in later):  # the same on every rank: the whole batch decides
            originals = [s for mini in minis[1:] for s in self.share_of(mini)]
            shares = [widened(s, self.config.pad_token_id) for s in originals]
            self.record_old_logp(shares)
            for original, share in zip(originals, shares, strict=True):
                if share is not original:  # a widened copy: its recorded log-probs, less the pad token's
                    width = len(original.response_ids)
                    original.old_logp = share.old_logp and share.old_logp[:width]
                    original.old_support_logp = share.old_support_logp and share.old_support_logp[:width]
        sums = dict.fromkeys(SUM_KEYS, 0.0)
        norms = []
        for mini in minis:
            add_sums(sums, self.accumulate(self.share(mini), response_tokens(mini)))
            norms.append(self.apply_update())
        self.end_step()
        totals = torch.tensor([sums[key] for key in SUM_KEYS], dtype=torch.float64)
        dist.all_reduce(totals)
        sums = dict(zip(SUM_KEYS, totals.tolist(), strict=True))
        lr = self.optimizer.param_groups[0]["lr"]
        return step_metrics(sums, total_tokens, sum(norms) / len(norms), lr, self.use_kl, len(minis))

    def padding_passes(self, samples: list) -> int:
        """How many zero-weight passes this rank adds to its micro-batches of ``samples`` so that every
        rank runs as many as the rank with the most (a collective)."""
        mine = torch.tensor([len(self.plan(samples)) if samples else 0])
        most = mine.clone()
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most - mine)

    @torch.no_grad()
    def record_old_logp(self, samples: list) -> None:
        fresh = [s for s in samples if s.behaviour_logp is None]
        pads = self.padding_passes(fresh)
        with packing(self.packed):
            super().record_old_logp(fresh)
            for _ in range(pads):
                super().record_old_logp([padding_sample(self.padding, self.config.pad_token_id)])
        self.policy.reshard_roots()

    def accumulate(self, samples: list, total_tokens: int) -> dict[str, float]:
        """The gradient of this rank's ``samples`` (``total_tokens``: all ranks'), reduce-scattered block
        by block into each rank's sharded gradient; this rank's loss sums. Then as many zero-weight
        passes as this rank has fewer micro-batches than the busiest rank."""
        pads = self.padding_passes(samples)
        with prompt_boundary() as self._boundary, packing(self.packed):
            sums = super().accumulate(samples, total_tokens) if samples else dict.fromkeys(SUM_KEYS, 0.0)
            for _ in range(pads):
                super().accumulate([self.padding], total_tokens)  # no trained tokens: zero loss, zero gradient
        return sums

    def packed(self, model: torch.nn.Module, mb) -> bool:
        """Whether this pass runs packed on every rank (a collective): each rank's micro-batch must ``fit``."""
        agree = torch.tensor([int(fits(model, mb))])
        dist.all_reduce(agree, op=dist.ReduceOp.MIN)
        self.packed_passes += int(agree)
        return bool(agree)

    def backward(self, loss: torch.Tensor) -> None:
        """A packed pass's one backward; or, after a prompt pass and a continuation, the responses' backward,
        then the prompts' (``backward_in_two``): a block serves both passes of a micro-batch, and in one
        backward its weights' gradient from the responses would wait for the prompts' backward, so every
        block's unsharded gradient would be held at once; in two, each block's is reduce-scattered as its
        backward ends, in both. FSDP finalizes (reshards the root) after the last only; every rank has a
        prompt pass and a continuation in every unpacked pass (``widened``)."""
        root = self.policy.roots[0]

        def last(is_last: bool) -> None:  # the root (gathered since its forward) is resharded after the last
            root.set_is_last_backward(is_last)
            root.set_reshard_after_backward(is_last, recurse=False)

        try:
            backward_in_two(loss, self._boundary, last)
        finally:
            last(True)

    def head_chunk(self, model: torch.nn.Module, mb) -> int | None:
        """A vocabulary-parallel head always runs chunked, whatever this rank's micro-batch: the full-logits
        path runs other collectives than the chunked one, so every rank must take the same, and the
        chunked one holds no ``[tokens, vocabulary]`` logits. A chunk is every rank's tokens over this
        rank's rows, so its size is counted in those rows."""
        parallel = VocabParallel.of(unwrap(model).get_output_embeddings())
        if parallel is None or not can_chunk(model):
            return super().head_chunk(model, mb)
        return chunk_tokens(parallel.rows, self.config.logits_chunk_bytes)

    @torch.no_grad()
    def _reference_logp(self, mb) -> torch.Tensor:
        """The reference's log-probs; a full fine-tune's reference (its own sharded copy) is resharded
        right after its forward, so at most one of the two models' roots is gathered at a time."""
        logp = super()._reference_logp(mb)
        if self.policy._reference_model is not None:
            self.policy.roots[-1].reshard()
        return logp

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


def widened(sample: TrainSample, pad_token_id: int) -> TrainSample:
    """``sample`` with a one-token response made two wide by a masked pad token (attended by nothing,
    trained on by nothing), so that its micro-batch's pass has a continuation like every other."""
    if len(sample.response_ids) != 1:
        return sample
    extend = {
        name: [*getattr(sample, name), 0.0]
        for name in ("behaviour_logp", "old_logp", "engine_logp", "old_support_logp")
        if getattr(sample, name) is not None
    }
    mask = sample.loss_mask if sample.loss_mask is not None else [1]
    return replace(sample, response_ids=[*sample.response_ids, pad_token_id], loss_mask=[*mask, 0], **extend)


def padding_sample(sample: TrainSample, pad_token_id: int) -> TrainSample:
    """A zero-weight pass: ``sample`` (widened) with no trained token, so its loss and gradient are zero."""
    sample = widened(sample, pad_token_id)
    blank = dict.fromkeys(("behaviour_logp", "old_logp", "old_support_logp"))  # fresh, unanchored
    return replace(sample, loss_mask=[0] * len(sample.response_ids), **blank)
