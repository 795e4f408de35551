"""``scripts/gpu_check.sh --dry-run``: the GPU check's every step on the CPU with tiny shapes, so that the script
run on a GPU machine cannot rot unseen. Its result files exist, are few and flat, and hold what they should."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ["env", "tests", "demo", "bench-0.5b", "bench-1.5b"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return proc, out


@pytest.mark.slow
def test_dry_run_passes_every_step_and_says_so(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is True and summary["dry_run"] is True and summary["device"] == "cpu"
    assert [s["step"] for s in summary["steps"]] == STEPS
    assert all(s["status"] == "ok" and s["exit"] == 0 and s["seconds"] <= s["limit_s"] for s in summary["steps"])
    assert summary["seconds"] <= summary["budget_s"]
    assert "not built yet" in summary["sync_probe"] or "sync/max_logprob_diff" in summary["sync_probe"]
    for name in STEPS:
        assert f"== {name}: ok" in proc.stdout


@pytest.mark.slow
def test_result_files_are_few_flat_and_plainly_named(dry_run):
    _, out = dry_run
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(
        ["summary.json", "env.txt", "tests.txt", "demo_metrics.jsonl", "demo.log", "bench.jsonl", "bench.log"]
    )
    assert all((out / f).is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    assert json.loads((out / "summary.json").read_text())["files"] == sorted(files)


@pytest.mark.slow
def test_environment_imports_every_module(dry_run):
    _, out = dry_run
    env = (out / "env.txt").read_text()
    assert "torch " in env and "cuda available: " in env and "openrft imported from " in env
    assert re.search(r"\d+ openrft modules: \d+ imported, \d+ need an optional extra, 0 failed", env)


@pytest.mark.slow
def test_cuda_tests_were_collected(dry_run):
    _, out = dry_run
    log = (out / "tests.txt").read_text()
    assert "tests/core/test_cuda.py::test_short_job_trains_on_the_gpu" in log
    assert re.search(r"\d+ (skipped|passed)", log) and " failed" not in log and " error" not in log


@pytest.mark.slow
def test_demo_ran_two_steps_on_the_cpu(dry_run):
    _, out = dry_run
    rows = [json.loads(line) for line in (out / "demo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("actor/pg_loss" in r for r in rows[1:]) and "val-score/rewards/mean@1" in rows[0]
    log = (out / "demo.log").read_text()
    assert '"status": "succeeded"' in log and 'spec runtime: {"device": "cpu"' in log


@pytest.mark.slow
def test_benchmark_json_lines_at_both_shapes(dry_run):
    _, out = dry_run
    lines = [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines()]
    assert [r["shape"] for r in lines] == ["0.5b", "1.5b"]
    for r in lines:
        assert r["benchmark"] == "gpu" and r["device"] == "cpu" and r["model"].startswith("tiny Qwen2")
        assert r["generated_tokens"] == 2 * 2 * 3 and r["learner_step_s"] > 0 and r["achieved_flops_per_s"] > 0
        assert r["command"].startswith("python -m benchmarks gpu --shape ") and r["versions"]["torch"]


def test_unknown_option_is_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "--bogus"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown option --bogus" in proc.stderr
