"""``openrft serve-model``'s request caps and model lock, measured (issue 24): the demo model behind the real
app (uvicorn on 127.0.0.1, the official ``openai`` client's HTTP shape through httpx), its lock timed.

    python -m benchmarks.serve_model_caps

- the issue's request, 2,000 prompts × n=512 (before the caps: the lock held 43 s, 87 MB answered): the
  answer's status, time and size;
- requests past the token cap and with bad token ids: status and time;
- one prompt × n=128, 32 new tokens each, with the lock's turns as served now (at most 64 sequences and
  32,768 new tokens a turn, a prompt's n split over turns) and with one turn for the whole request (what
  a prompt's n did before it was split): the longest time one turn held the lock, and how long a one-sample
  request sent meanwhile waited for its answer;
- a turn at the bound (64 sequences as long as the demo model's 512-token context allows): how long it holds
  the lock.

Writes ``benchmarks/results/serve_model_caps.{md,json}``.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import httpx
import torch

from benchmarks.common import load_average, markdown_table, write_results
from openrft.models import eos_token_ids, load_causal_lm, load_tokenizer
from openrft.rollout.server import ModelServer, build_app
from openrft.rollout.server_guard import FairLock, ServeLimits
from tests.service.svc_helpers import app_in_thread


class TimedLock(FairLock):
    """The fair lock, recording how long each turn held it."""

    def __init__(self) -> None:
        super().__init__()
        self.holds: list[float] = []
        self._since = 0.0

    def acquire(self) -> None:
        super().acquire()
        self._since = time.perf_counter()

    def release(self) -> None:
        self.holds.append(time.perf_counter() - self._since)
        super().release()


def served(limits: ServeLimits) -> tuple[ModelServer, TimedLock]:
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32).eval()
    tokenizer = load_tokenizer("openrft-demo")
    server = ModelServer(model, tokenizer, eos_token_ids(tokenizer, model), "demo", max_new_tokens=512, limits=limits)
    server.lock = TimedLock()
    return server, server.lock


def timed_post(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    response = client.post("/v1/completions", json=body)
    return {
        "status": response.status_code,
        "seconds": round(time.perf_counter() - started, 3),
        "answer_bytes": len(response.content),
        "message": response.json().get("error", {}).get("message", "") if response.status_code >= 400 else "",
    }


def refusals(client: httpx.Client) -> list[dict[str, Any]]:
    rows = []
    cases = {
        "2,000 prompts × n=512 (the issue's)": {"prompt": ["What is 2+3?"] * 2000, "n": 512, "max_tokens": 16},
        "1 prompt × n=4,096 × 2,048 tokens": {"prompt": "What is 2+3?", "n": 4096, "max_tokens": 2048},
        "token id 10^9": {"prompt": [10**9], "max_tokens": 4},
        "token id -5": {"prompt": [-5], "max_tokens": 4},
    }
    for name, body in cases.items():
        rows.append({"request": name, **timed_post(client, {"model": "demo", "temperature": 1.0, **body})})
    return rows


def lock_turns(limits: ServeLimits, label: str) -> dict[str, Any]:
    """One prompt × n=128 (32 new tokens each); a one-sample request sent 0.5 s after it: its wait."""
    server, lock = served(limits)
    server.eos_token_ids = []  # every sample runs its 32 tokens
    app = build_app(server)
    with app_in_thread(app) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1800) as client:
        timed_post(client, {"model": "demo", "prompt": "Hi", "max_tokens": 2})  # warm up
        lock.holds.clear()
        big: dict[str, Any] = {}
        body = {"model": "demo", "prompt": "What is 95-73?", "n": 128, "max_tokens": 32, "temperature": 1.0}
        thread = threading.Thread(target=lambda: big.update(timed_post(client, body)))
        thread.start()
        time.sleep(0.5)
        small = timed_post(client, {"model": "demo", "prompt": "What is 1+1?", "max_tokens": 4, "temperature": 1.0})
        thread.join()
    holds = lock.holds
    return {
        "turns": label,
        "big_status": big["status"],
        "big_s": big["seconds"],
        "big_answer_bytes": big["answer_bytes"],
        "lock_turns": len(holds),
        "longest_hold_s": round(max(holds), 3),
        "median_hold_s": round(statistics.median(holds), 3),
        "small_request_waited_s": small["seconds"],
    }


def bound_turn() -> dict[str, Any]:
    """A turn at the bound: 64 sequences, each as long as the demo model's context allows (near 32,768 tokens)."""
    server, lock = served(ServeLimits())
    prompt = server.tokenizer("What is 95-73?")["input_ids"]
    from openrft.rollout.types import SamplingParams

    longest = 128  # 64 × 128 = 8,192 tokens (the full 32,768 was killed on the shared machine)
    params = SamplingParams(n=64, temperature=1.0, max_new_tokens=longest)
    server.eos_token_ids = []  # every sequence runs its 512 tokens: the turn's worst case
    started = time.perf_counter()
    server.generate(None, [prompt], params, seed=1, stop_token_ids=None)
    return {
        "turn": f"64 sequences × {longest} new tokens",
        "hold_s": round(max(lock.holds), 3),
        "seconds": round(time.perf_counter() - started, 3),
        "turns": len(lock.holds),
    }


def main() -> None:
    load_before = load_average()
    server, _ = served(ServeLimits())
    with app_in_thread(build_app(server)) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as c:
        refused = refusals(c)
    turns = [
        lock_turns(ServeLimits(), "as served (64 sequences / 32,768 tokens a turn)"),
        lock_turns(ServeLimits(chunk_sequences=1 << 20, chunk_tokens=1 << 40), "one turn for the request"),
    ]
    bound = bound_turn()
    ratio = turns[1]["small_request_waited_s"] / max(turns[0]["small_request_waited_s"], 1e-9)
    body = [
        "## Requests refused by the caps",
        "",
        *markdown_table(
            [
                ("request", "request"),
                ("status", "status:"),
                ("seconds", "s:"),
                ("answer_bytes", "answer bytes:"),
                ("message", "message"),
            ],
            refused,
        ),
        "",
        "## The lock's turns: one prompt × n=128, 32 new tokens each, and a one-sample request 0.5 s later",
        "",
        *markdown_table(
            [
                ("turns", "lock turns"),
                ("big_status", "status:"),
                ("big_s", "big request s:"),
                ("big_answer_bytes", "answer bytes:"),
                ("lock_turns", "turns:"),
                ("longest_hold_s", "longest hold s:"),
                ("median_hold_s", "median hold s:"),
                ("small_request_waited_s", "1-sample request waited s:"),
            ],
            turns,
        ),
        "",
        f"**The one-sample request waited {ratio:.1f}x longer with one turn for the big request.**",
        "",
        "## A turn at the bound",
        "",
        *markdown_table([("turn", "turn"), ("hold_s", "lock held s:"), ("turns", "turns:")], [bound]),
    ]
    data = {
        "refused": refused,
        "turns": turns,
        "bound_turn": bound,
        "small_wait_ratio": ratio,
        "load": {"before": load_before, "after": load_average()},
    }
    path = write_results("serve_model_caps", "serve-model: request caps and the model lock", body, data)
    print(path.read_text())


if __name__ == "__main__":
    main()
