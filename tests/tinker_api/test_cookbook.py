"""The tinker-cookbook's ``sl_loop`` and ``rl_loop`` (0.6.1, its default loss) run unchanged against ``openrft
serve`` through our runner (examples/tinker_cookbook/run_recipe.py: only the tokenizer, renderer and datasets a
machine without the Hub needs are substituted), end with exit 0, and their final checkpoints load and sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("tinker_cookbook", reason="make venv installs tinker-cookbook 0.6.1 (docs/tinker.md)")
from tinker import types  # noqa: E402

from tests.service.svc_helpers import Service  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "examples" / "tinker_cookbook" / "run_recipe.py"


def test_sl_loop_and_rl_loop_run_to_the_end_and_their_final_checkpoints_load(tmp_path):
    os.environ["TINKER_TELEMETRY"] = "0"
    service = Service(tmp_path / "data", f"sqlite:///{tmp_path / 'openrft.db'}", env={"HF_HUB_OFFLINE": "1"})
    try:
        service.wait_healthy(service.serve(workers=0, wait=False), timeout=400)
        env = {**os.environ, "TINKER_API_KEY": "tml-local", "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1"}
        client = tinker.ServiceClient(base_url=service.base_url, api_key="tml-local")
        for recipe in ("sl", "rl"):
            log_path = tmp_path / recipe
            done = subprocess.run(
                [sys.executable, str(RUNNER), recipe, "--base-url", service.base_url, "--log-path", str(log_path)],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
            )
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
            saved = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
            final = next(c for c in saved if c["name"] == "final")
            sampler = client.create_sampling_client(model_path=final["sampler_path"])
            prompt = types.ModelInput.from_ints([1, 2, 3])
            sample = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, seed=0)).result()
            assert sample.sequences and sample.sequences[0].tokens, sample
            resumed = client.create_training_client_from_state(final["state_path"])
            assert resumed.save_state(f"{recipe}-reloaded").result().path.endswith(f"/weights/{recipe}-reloaded")
    finally:
        service.stop_all()
