"""A small reward server implementing the Nova reward "Lambda" contract over HTTP (standard library only).

    python examples/reward_server/server.py --port 8080

POST a JSON list of ``{"id", "messages", "metadata"}`` (``reference_answer`` under ``metadata`` or
at the top level); the answer is one ``{"id", "aggregate_reward_score", "metrics_list"}`` per
entry. The reward: 1.0 when the last number in the assistant's last message equals the last number
of the reference answer (or, for a non-numeric reference, the trimmed texts are equal), else 0.0;
``metrics_list`` also carries ``format`` (a Reward: 1 when the answer holds a number) and
``response_chars`` (a Metric). Point an OpenRFT job at it with a ``nova_lambda`` reward whose
endpoint is ``http://127.0.0.1:8080/``.

``--delay`` / ``--per-sample-delay`` simulate scoring work. The ``--fault`` and ``--flaky-rate``
options inject failures to test clients: ``--fault PREFIX=KIND`` makes every call holding an id
that starts with PREFIX fail with KIND (``drop``: close the connection unanswered; ``slow``: answer
after ``--slow-seconds``; ``malformed``: a body that is not JSON; ``http500``; ``bad_entry``: that
entry lacks its score). ``--flaky-rate P`` drops the first attempt of a fraction P of distinct
request bodies without faults (a retry then succeeds). ``GET /stats`` returns the counters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def reference_of(entry: dict) -> object:
    metadata = entry.get("metadata") or {}
    return entry.get("reference_answer", metadata.get("reference_answer"))


def reference_text(reference: object) -> str:
    if isinstance(reference, dict):
        for key in ("answer", "solution", "ground_truth"):
            if key in reference:
                return str(reference[key])
        return json.dumps(reference)
    return "" if reference is None else str(reference)


def score_entry(entry: dict, constant: float | None = None) -> dict:
    messages = entry.get("messages") or []
    answer = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "assistant"), "")
    reference = reference_text(reference_of(entry))
    got, expected = NUMBER.findall(answer or ""), NUMBER.findall(reference)
    numeric = bool(got) and bool(expected) and float(got[-1]) == float(expected[-1])
    correct = numeric if expected else answer.strip() == reference.strip()
    return {
        "id": entry.get("id"),
        "aggregate_reward_score": constant if constant is not None else 1.0 if correct else 0.0,
        "metrics_list": [
            {"name": "format", "value": 1.0 if got else 0.0, "type": "Reward"},
            {"name": "response_chars", "value": float(len(answer or "")), "type": "Metric"},
        ],
    }


class RewardServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog (5) is below Nova's default lambda_concurrency_limit (12):
    # connections beyond it wait for a SYN retransmit (1 s), which a caller with a short timeout sees as one.
    request_queue_size = 128

    def __init__(self, address, options: argparse.Namespace):
        super().__init__(address, RewardHandler)
        self.options = options
        self.faults = dict(f.split("=", 1) for f in options.fault)
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.stats = {
            "requests": 0,
            "samples": 0,
            "answered": 0,
            "flaky_drops": 0,
            **{f"fault_{kind}": 0 for kind in ("drop", "slow", "malformed", "http500", "bad_entry")},
        }

    def count(self, key: str, amount: int = 1) -> None:
        with self.lock:
            self.stats[key] += amount


class RewardHandler(BaseHTTPRequestHandler):
    server: RewardServer
    protocol_version = "HTTP/1.1"
    wbufsize = -1  # headers and body leave in one write (flushed after each request)
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args) -> None:  # quiet by default
        if self.server.options.verbose:
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/stats":
            with self.server.lock:
                self._send(200, json.dumps(self.server.stats).encode())
        else:
            self._send(200, b'{"status": "ok"}')

    def do_POST(self) -> None:
        server, options = self.server, self.server.options
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server.count("requests")
        try:
            entries = json.loads(raw)
            if not isinstance(entries, list):
                raise ValueError("expected a list")
        except ValueError as exc:
            self._send(400, json.dumps({"error": str(exc)}).encode())
            return
        server.count("samples", len(entries))
        kinds = {
            kind for prefix, kind in server.faults.items() for e in entries if str(e.get("id", "")).startswith(prefix)
        }
        digest = hashlib.sha256(raw).hexdigest()
        with server.lock:
            first_time = digest not in server.seen
            server.seen.add(digest)
        if not kinds and first_time and int(digest[:8], 16) % 10_000 < options.flaky_rate * 10_000:
            server.count("flaky_drops")
            self.close_connection = True
            self.connection.close()
            return
        for kind in ("drop", "http500", "malformed", "slow"):
            if kind in kinds:
                server.count(f"fault_{kind}")
        if "drop" in kinds:
            self.close_connection = True
            self.connection.close()
            return
        if "http500" in kinds:
            self._send(500, b'{"error": "injected failure"}')
            return
        time.sleep(options.delay + options.per_sample_delay * len(entries))
        if "slow" in kinds:
            time.sleep(options.slow_seconds)
        if "malformed" in kinds:
            self._send(200, b"<html>this is not JSON", "text/html")
            return
        results = []
        for entry in entries:
            result = score_entry(entry, options.constant)
            if any(str(entry.get("id", "")).startswith(p) and k == "bad_entry" for p, k in server.faults.items()):
                server.count("fault_bad_entry")
                del result["aggregate_reward_score"]
            results.append(result)
        server.count("answered", len(entries))
        self._send(200, json.dumps(results).encode())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of simulated work per call")
    parser.add_argument("--per-sample-delay", type=float, default=0.0, help="seconds of simulated work per sample")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="ID_PREFIX=KIND",
        help="drop | slow | malformed | http500 | bad_entry for calls holding such ids",
    )
    parser.add_argument("--slow-seconds", type=float, default=5.0)
    parser.add_argument("--flaky-rate", type=float, default=0.0, help="drop the first attempt of this fraction")
    parser.add_argument("--constant", type=float, help="answer this score for every sample (load tests)")
    parser.add_argument("--verbose", action="store_true")
    options = parser.parse_args(argv)
    server = RewardServer((options.host, options.port), options)
    print(f"listening on http://{options.host}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
