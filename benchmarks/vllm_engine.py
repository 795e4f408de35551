"""The same job with OpenRFT's in-process generator and with a vLLM server (``python -m benchmarks vllm``).

Two models: the demo model (0.8M parameters, where per-request overhead dominates) and a wider Qwen2 of
the demo's family with random weights (``wide_config``, about 59M parameters, built
here, nothing downloaded), where generation dominates. For each model one vLLM server is started
(scripts/vllm_server.sh, from ``.venv-vllm``; ``make vllm-venv`` builds it), then the job runs with
``rollout.engine`` local and server, alternating which goes first, in this process. Per-step time is
the median of ``perf/time_per_step`` leaving out the first step; generation tokens/s are the sampled
tokens of a step over its ``timing/sampling_and_reward`` (the reward is exact match, microseconds).
vLLM's colocated engine (``rollout.engine: vllm``) is measured where vLLM is importable in this
Python (it is not in the project's ``.venv``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from benchmarks.common import ROOT

DEMO = ROOT / "src" / "openrft" / "assets" / "demo_model"
DATA = ROOT / "examples" / "arithmetic"


def wide_config():
    """The demo's vocabulary and special tokens with wider and more layers: about 59M parameters, where
    generation, not per-request overhead, takes the step. (Not Qwen2.5-0.5B's shape: its 151,936-token
    vocabulary needs a tokenizer of that size, which ``benchmarks.real_shape`` builds.)"""
    from transformers import Qwen2Config

    demo = json.loads((DEMO / "config.json").read_text())
    return Qwen2Config(
        vocab_size=demo["vocab_size"],
        hidden_size=640,
        intermediate_size=1920,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=demo["max_position_embeddings"],
        tie_word_embeddings=True,
        eos_token_id=demo["eos_token_id"],
        pad_token_id=demo["pad_token_id"],
    )


def wide_model(directory: Path) -> Path:
    """The wider random Qwen2 (safetensors + the demo's tokenizer files), saved to ``directory``."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(wide_config()).to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (DEMO / name).exists():
            shutil.copy(DEMO / name, directory / name)
    return directory


def recipe(directory: Path, model: str, steps: int, prompts: int, samples: int, new_tokens: int, engine: dict) -> Path:
    body = {
        "run": {
            "name": "bench-vllm",
            "model_name_or_path": model,
            "data_s3_path": str(DATA / "train.jsonl"),
            "validation_data_s3_path": str(DATA / "validation.jsonl"),
        },
        "training_config": {
            "max_length": 64 + new_tokens,
            "global_batch_size": prompts * samples,
            "rollout": {
                "advantage_strategy": {"number_generation": samples},
                "generator": {"max_new_tokens": new_tokens, "temperature": 1.0, "top_k": 0},
                "rewards": {"preset_reward_function": "exact_match"},
            },
            "trainer": {
                "max_steps": steps,
                "save_steps": 1000,
                "test_steps": 1000,
                "kl_loss_coef": 0.0,
                "optim_config": {"lr": 2e-4},
                "peft": {"peft_scheme": "lora"},
            },
        },
        "openrft": {"eval_at_start": False, "eval_max_examples": 1, "tensorboard": False, "threads": 1, **engine},
    }
    path = directory / "recipe.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def run_job(recipe_path: Path, run_dir: Path) -> dict:
    from openrft.engine.job import RFTJob
    from openrft.runtime import runtime_for
    from openrft.spec.dialects import load_job

    spec = load_job(recipe_path)
    started = time.perf_counter()
    RFTJob(spec, run_dir, show_progress=False, runtime=runtime_for(spec)).run()
    wall = time.perf_counter() - started
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "perf/time_per_step" in m][1:]  # the first step warms up
    sampled = [m["response_length/mean"] * spec.samples_per_step for m in steps]
    return {
        "step_s": statistics.median(m["perf/time_per_step"] for m in steps),
        "generation_s": statistics.median(m["timing/sampling_and_reward"] for m in steps),
        "training_s": statistics.median(m["timing/training"] for m in steps),
        "gen_tokens_per_s": statistics.median(t / m["timing/sampling_and_reward"] for t, m in zip(sampled, steps)),
        "wall_s": wall,
        "kl": statistics.median(m.get("rollout_correction/kl", float("nan")) for m in steps),
    }


class Server:
    def __init__(self, model: Path, state: Path, threads: int):
        self.env = {
            **os.environ,
            "VLLM_STATE_DIR": str(state),
            "VLLM_MODEL": str(model),
            "VLLM_SERVED_NAME": "bench",
            "VLLM_THREADS": str(threads),
        }

    def __enter__(self) -> str:
        started = time.perf_counter()
        out = subprocess.run(
            ["bash", "scripts/vllm_server.sh", "start"], cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        if out.returncode:
            raise RuntimeError(f"vLLM did not start: {out.stderr[-2000:]}")
        self.start_s = time.perf_counter() - started
        return out.stdout.strip().splitlines()[-1]

    def __exit__(self, *exc) -> None:
        subprocess.run(["bash", "scripts/vllm_server.sh", "stop"], cwd=ROOT, env=self.env)


def colocated_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def vllm_rows(
    steps: int, threads: int, quick: bool, log: Callable[[str], None], models: tuple[str, ...] = ("demo", "wide")
) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        tmp_path = Path(tmp)
        chosen = []
        if "demo" in models:
            chosen.append(("demo (0.8M)", DEMO, 32, 8, 6))
        if "wide" in models and not quick:
            chosen.append(("wide random Qwen2 (59M)", wide_model(tmp_path / "wide"), 16, 8, 24))
        models = chosen
        for label, path, prompts, samples, new_tokens in models:
            with Server(path, tmp_path / f"server-{len(rows)}", threads) as url:
                engines = [("local", {}), ("vLLM server", {"generator_base_url": url})]
                if colocated_available():
                    engines.append(("vLLM colocated", {"generation_engine": "vllm"}))
                for order, (name, engine) in enumerate(engines if len(rows) % 2 == 0 else engines[::-1]):
                    work = tmp_path / f"{len(rows)}-{order}"
                    work.mkdir()
                    result = run_job(recipe(work, str(path), steps, prompts, samples, new_tokens, engine), work / "run")
                    row = {"model": label, "engine": name, "prompts": prompts, "samples": samples, **result}
                    log(json.dumps(row))
                    rows.append(row)
    return rows


def demo_runs(
    steps: int,
    threads: int,
    log: Callable[[str], None],
    engine: str = "server",
    strategies: tuple[str, ...] = ("sync", "off_policy_async"),
) -> list[dict]:
    """The demo recipe (examples/arithmetic/recipe.yaml, unchanged but for the engine) trained through vLLM,
    sync and off_policy_async: the validation curve (the learner's own sampler, as in `make demo`).
    ``engine``: ``server`` (a scripts/vllm_server.sh server, ``generator_base_url``) or ``colocated``
    (``rollout.engine: vllm``, vLLM's LLM engine in this process; vLLM must be importable here)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-demo-") as tmp, contextlib.ExitStack() as stack:
        tmp_path = Path(tmp)
        if engine == "server":
            url = stack.enter_context(Server(DEMO, tmp_path / "server", threads))
            openrft_engine = {"generator_base_url": url}
        elif engine == "colocated":
            openrft_engine = {"generation_engine": "vllm"}
        else:
            raise ValueError(f"vllm-demo engine {engine!r}: allowed are 'server' and 'colocated'")
        for strategy in strategies:
            body = yaml.safe_load((DATA / "recipe.yaml").read_text())
            body["run"]["data_s3_path"] = str(DATA / "train.jsonl")
            body["run"]["validation_data_s3_path"] = str(DATA / "validation.jsonl")
            body["run"].pop("output_s3_path", None)
            body["run"]["name"] = f"demo-vllm-{strategy.replace('_', '-')}"
            body["training_config"]["trainer"]["max_steps"] = steps
            body["training_config"]["rollout"]["rollout_strategy"] = {"type": strategy}
            body["openrft"].update(openrft_engine)
            work = tmp_path / strategy
            work.mkdir()
            path = work / "recipe.yaml"
            path.write_text(yaml.safe_dump(body))
            from openrft.engine.job import RFTJob
            from openrft.runtime import runtime_for
            from openrft.spec.dialects import load_job

            spec = load_job(path)
            started = time.perf_counter()
            RFTJob(spec, work / "run", show_progress=False, runtime=runtime_for(spec)).run()
            row = demo_row(engine, strategy, work / "run", time.perf_counter() - started)
            log(json.dumps(row))
            rows.append(row)
    return rows


def demo_row(engine: str, strategy: str, run_dir: Path, wall_s: float) -> dict:
    """One run of ``demo_runs`` from its metrics.jsonl: the validation curve, its gain, the engine KL."""
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve = {m["step"]: m["val-score/rewards/mean@1"] for m in metrics if "val-score/rewards/mean@1" in m}
    kls = [m["rollout_correction/kl"] for m in metrics if "rollout_correction/kl" in m]
    step_times = [m["perf/time_per_step"] for m in metrics if "perf/time_per_step" in m]
    steps = max((m["step"] for m in metrics if "actor/pg_loss" in m), default=0)
    baseline, final = curve[min(curve)], curve[max(curve)]
    return {
        "engine": engine,
        "strategy": strategy,
        "steps": steps,
        "baseline": baseline,
        "final": final,
        "gain_points": 100 * (final - baseline),
        "wall_s": wall_s,
        "step_s_median": statistics.median(step_times) if step_times else float("nan"),
        "kl_median": statistics.median(kls) if kls else float("nan"),
        "kl_max": max(kls) if kls else float("nan"),
        "curve": curve,
    }
