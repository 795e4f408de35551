"""Per-learner memory and step time of the sharded learner (``rollout.learner_sharding: fsdp``) against one learner.

The model is Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocabulary
151,936, tied embeddings; its published config.json), random weights built here (nothing downloaded);
``layers`` fewer for a lighter run of the same width and vocabulary. Each
configuration runs in fresh processes: one learner is the engine's ``Learner`` in one process; N learners
are ``ShardedLearner`` ranks under ``torch.distributed.run`` (gloo). Per learner (the largest over the
ranks):

- ``state_mib_per_learner``: the parameters and AdamW state the learner holds between steps (its
  shards' bytes, counted tensor by tensor; gradients are freed after each step);
- ``peak_mib_per_learner``: the step's resident-memory high-water mark (``/proc/self/clear_refs`` reset
  just before it), the whole process (libraries ``baseline_mib`` included);
- ``peak_above_baseline_mib``: that peak less the process's resident memory before the model is built;
- ``step_s``: the median of the timed steps;
- ``step_cpu_s``: the CPU seconds of a step (the median), summed over the learners: the work the step
  took whatever else the machine ran (``step_s`` is also waiting for a core);
- ``load_before``: the machine's 1-minute load average when the configuration started;
- ``transport``: how the ranks' collectives move their bytes: ``shared_memory`` (the sharded learner's
  default for CPU ranks on one host, ``openrft.learner.shared_memory``) or ``gloo`` (TCP), chosen with
  ``OPENRFT_FSDP_TRANSPORT``; ``transports`` runs the N-learner configurations with each, side by side.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, load_average, run_worker
from benchmarks.learner import _release_free_memory
from openrft.learner.shared_memory import TRANSPORT_VARIABLE

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 896, 24, 14, 2, 4864, 151_936  # Qwen2.5-0.5B
LEARNERS = (1, 2, 4)
TRANSPORTS = ("shared_memory",)
PROMPTS, SAMPLES, PROMPT_TOKENS, RESPONSE_TOKENS = 2, 4, 24, 24


def model_config(layers: int = LAYERS):
    """Qwen2.5-0.5B's shape with ``layers`` decoder layers (the demo's special tokens)."""
    from transformers import Qwen2Config

    demo = json.loads((ROOT / "src" / "openrft" / "assets" / "demo_model" / "config.json").read_text())
    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=demo["max_position_embeddings"],
        tie_word_embeddings=True,
        eos_token_id=demo["eos_token_id"],
        pad_token_id=demo["pad_token_id"],
    )


def _kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def _local_bytes(tensor: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def held_state_mib(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Parameters (this learner's shards) and AdamW moments held between steps, in MiB."""
    params = sum(_local_bytes(p) for p in model.parameters())
    moments = sum(_local_bytes(v) for state in optimizer.state.values() for v in state.values() if v.dim() > 0)
    return (params + moments) / 2**20


def _samples(vocab: int):
    from openrft.learner.batch import TrainSample

    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(PROMPTS):
        prompt = torch.randint(0, vocab - 3, (PROMPT_TOKENS,), generator=g).tolist()
        for k in range(SAMPLES):
            response = torch.randint(0, vocab - 3, (RESPONSE_TOKENS,), generator=g).tolist()
            samples.append(TrainSample(prompt, response, advantage=float(k) - 1.5))
    return samples


def worker(mode: str, learners: int, steps: int, layers: int = LAYERS) -> None:
    """One learner (or one rank of ``learners``): build, warm up one step, time ``steps``; rank 0 prints JSON."""
    import torch.distributed as dist
    from transformers import Qwen2ForCausalLM

    from openrft.engine.local_runtime import learner_config
    from openrft.learner import Learner, Policy
    from openrft.learner.sharded import ShardedLearner, ShardedPolicy
    from openrft.spec.dialects import load_job

    torch.set_num_threads(1)
    baseline = _kib("VmRSS") / 1024
    spec = load_job(ROOT / "examples" / "arithmetic" / "recipe.yaml")
    spec.lora.enabled = mode == "lora"
    spec.algorithm.kl_loss_coef = 0.0  # model states only: no reference policy
    config = model_config(layers)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    cfg = learner_config(spec, config.pad_token_id)
    if learners > 1:
        dist.init_process_group("gloo")
        policy = ShardedPolicy(model, spec.lora, False, torch.device("cpu"))
        learner = ShardedLearner(policy, cfg)
    else:
        learner = Learner(Policy(model, spec.lora, need_reference=False), cfg)
    del model
    samples = _samples(config.vocab_size)
    learner.step(samples)  # warm-up: AdamW's state exists from here on
    times, cpu, peaks = [], [], []
    for _ in range(steps):
        _release_free_memory()
        Path("/proc/self/clear_refs").write_text("5")
        start, start_cpu = time.perf_counter(), time.process_time()
        learner.step(samples)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        peaks.append(_kib("VmHWM") / 1024)
    row = {
        "learners": learners,
        "mode": mode,
        "parameters": parameters,
        "trainable_parameters": sum(p.numel() for p in learner.policy.model.parameters() if p.requires_grad),
        "peak_mib_per_learner": round(max(peaks), 1),
        "peak_above_baseline_mib": round(max(peaks) - baseline, 1),
        "state_mib_per_learner": round(held_state_mib(learner.model, learner.optimizer), 1),
        "baseline_mib": round(baseline, 1),
        "step_s": round(statistics.median(times), 3),
        "step_cpu_s": round(statistics.median(cpu), 3),
        "transport": getattr(learner.policy, "transport", None),
    }
    if learners > 1:
        rows: list = [None] * learners
        dist.all_gather_object(rows, row)
        for key in (
            "peak_mib_per_learner",
            "peak_above_baseline_mib",
            "state_mib_per_learner",
            "baseline_mib",
            "step_s",
        ):
            row[key] = max(r[key] for r in rows)  # the largest learner's
        row["step_cpu_s"] = round(sum(r["step_cpu_s"] for r in rows), 3)  # all the learners' work
        if dist.get_rank() == 0:
            print(json.dumps(row), flush=True)
        dist.destroy_process_group()
    else:
        print(json.dumps(row), flush=True)


def run_configuration(
    mode: str, learners: int, steps: int, timeout: float, layers: int = LAYERS, transport: str = "shared_memory"
) -> dict:
    """One configuration in fresh processes (the N learners' collectives through ``transport``); its JSON row
    (or the error)."""
    module = ["-m", "benchmarks.sharding", "--worker", mode, str(learners), str(steps), str(layers)]
    if learners > 1:
        from openrft.runtime.process_group import free_port

        launch = ["-m", "torch.distributed.run", "--nproc-per-node", str(learners), "--master-port", str(free_port())]
        command = [sys.executable, *launch, *module]
    else:
        command = [sys.executable, *module]
    identity = {"learners": learners, "mode": mode, "transport": transport if learners > 1 else None}
    return run_worker(command, 1, timeout, identity, {TRANSPORT_VARIABLE: transport})


def sharding_rows(
    steps: int,
    timeout: float,
    log,
    layers: int = LAYERS,
    modes=("full", "lora"),
    learner_counts=LEARNERS,
    transports=TRANSPORTS,
) -> list[dict]:
    """Full fine-tuning and LoRA at 1, 2 and 4 learners (N learners once per transport), one configuration at
    a time; each row's ratios against one learner's (the first count must be 1 for them)."""
    rows: list[dict] = []
    one: dict = {}
    configurations = [
        (mode, learners, transport)
        for mode in modes
        for learners in learner_counts
        for transport in (transports if learners > 1 else transports[:1])
    ]
    for mode, learners, transport in configurations:
        load = load_average()
        row = run_configuration(mode, learners, steps, timeout, layers, transport)
        row["layers"], row["load_before"] = layers, load[0] if load else None
        one = row if learners == 1 else one
        if learners > 1 and one and "error" not in one and "error" not in row:
            for key in ("state_mib_per_learner", "peak_mib_per_learner", "peak_above_baseline_mib"):
                row[key.replace("_mib_per_learner", "").replace("_mib", "") + "_vs_one_learner"] = round(
                    row[key] / one[key], 3
                )
            row["step_per_sample_vs_one_learner"] = round(row["step_s"] / one["step_s"], 3)
            row["cpu_per_sample_vs_one_learner"] = round(row["step_cpu_s"] / one["step_cpu_s"], 3)
        log(json.dumps(row))
        rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=4, metavar=("MODE", "LEARNERS", "STEPS", "LAYERS"), required=True)
    mode, learners, steps, layers = parser.parse_args().worker
    worker(mode, int(learners), int(steps), int(layers))
