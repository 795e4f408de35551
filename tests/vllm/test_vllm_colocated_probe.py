"""The sync probe on the colocated engine (vLLM's ``LLM`` in the job's process, run from vLLM's Python): every
version loaded under one LoRA name and id, which vLLM keeps serving from its cache, is caught naming the replica,
the version and the difference (tests/vllm/test_vllm_colocated.py: a correct sync passes)."""

from __future__ import annotations

import json
import os
import re
import subprocess

from tests.conftest import ROOT
from tests.vllm.test_vllm_colocated import colocated_recipe, vllm_python


def test_a_reused_lora_id_is_caught_in_a_colocated_job(tmp_path):
    recipe = colocated_recipe(tmp_path, steps=3)
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    script = ROOT / "tests" / "vllm" / "colocated_reused_id.py"
    out = subprocess.run(
        [str(vllm_python()), str(script), str(recipe), str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    caught = json.loads(out.stdout.strip().splitlines()[-1])["caught"]
    assert caught, "the planted fault was not caught"
    match = re.search(r"replica (\S+) serves policy version (\d+) .* by (\S+) on the sync probe", caught)
    assert match and match.group(1) == "vllm" and int(match.group(2)) >= 1, caught
    assert float(match.group(3)) > 1e-3  # vLLM's fp32 tolerance
