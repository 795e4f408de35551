"""Shared test helpers: score texts with a reward config, and run the example reward server."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from openrft.data.records import Example
from openrft.rewards import RewardOutcome, RewardSample, build_reward
from openrft.spec.rewards import RewardSpec

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "reward_server" / "server.py"
FAST_REMOTE = {"timeout_s": 0.5, "max_retries": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}


def example(**fields) -> Example:
    messages = fields.pop("messages", [{"role": "user", "content": "What is 2+3?"}])
    return Example(id=str(fields.pop("id", "e1")), messages=messages, fields=fields)


def spec(function: dict, **extra) -> RewardSpec:
    return RewardSpec.model_validate({"function": function, **extra})


def score(function: dict | RewardSpec, texts: list[str], ex: Example | None = None, **extra) -> list[RewardOutcome]:
    reward = build_reward(function if isinstance(function, RewardSpec) else spec(function, **extra))
    ex = ex or example(reference_answer="5")

    async def go():
        try:
            return await reward.score([RewardSample(ex, t, step=1, sample_index=i) for i, t in enumerate(texts)])
        finally:
            await reward.aclose()

    return asyncio.run(go())


def scores(function: dict, texts: list[str], ex: Example | None = None, **extra) -> list[float | None]:
    return [o.score if o.ok else o.error_kind for o in score(function, texts, ex, **extra)]


def require_bwrap() -> None:
    """Strict-sandbox tests need bubblewrap: skipped on a developer machine without it, failed in CI."""
    if shutil.which("bwrap") is None:
        if os.environ.get("CI"):
            pytest.fail("bubblewrap is missing in CI: .ci/run must install it")
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")


@contextmanager
def reward_server(*args: str):
    """The example Nova reward server on a free 127.0.0.1 port; yields its URL."""
    process = subprocess.Popen([sys.executable, str(SERVER), "--port", "0", *args], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert match, f"server did not start: {line!r}"
        yield match.group(1)
    finally:
        process.terminate()
        process.wait(timeout=10)


SECRETS = {"OPENRFT_JUDGE_API_KEY": "sk-judge-secret-i14", "OPENRFT_TEST_SECRET": "tenant-must-not-see-this"}
"""Set in the environment of whatever runs user code (the CLI, the server, a worker); user code must not see them."""

SECRET_PROBE = f'''
import os
SECRETS = {sorted(SECRETS.values())!r}
NAMES = {sorted(SECRETS)!r}

def leaks():
    """Every place user code could read the host's environment: its own, and every /proc entry it can see."""
    seen = [f"{{k}}={{v}}" for k, v in os.environ.items()]
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{{pid}}/{{name}}", "rb") as f:
                    seen.append(f.read().decode("utf-8", "replace"))
            except OSError:
                pass
    found = [s for s in SECRETS + NAMES if any(s in text for text in seen)]
    return found, len(pids)

def grade(sample, item):
    found, pids = leaks()
    assert pids >= 1, "no /proc to read"
    return 1.0 if found else 0.25

def evaluate(example, response):
    return grade(None, None)
'''
"""A Python grader (and Vertex ``evaluate``) scoring 1.0 when it can read a secret, 0.25 when it cannot."""
