"""The files of ``src/openrft`` a grader passes through from the ``graders/run`` route to its score.

    python scripts/grader_walk.py [--json] [--tenant]

Posts each grader to ``POST /v1/fine_tuning/alpha/graders/run`` of the real FastAPI app (``TestClient``,
a SQLite store in a temporary folder) and lists every file under ``src/openrft`` whose functions ran on
the call path from the route's handler down to the score, in the order first entered: the handler and
everything it calls, the grader pool's thread included. What runs before the handler (middleware, the
API key, parsing the body) and module bodies run by imports are not counted; each grader is posted once
first so that lazy imports and caches are behind it. A measure of how much a reader has to open to follow
one request (docs/design.md, "A grader from the API to its score"; tests/service/test_grader_walk.py
holds it to ``LIMIT``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent.parent / "src" / "openrft"
ROUTE = "/v1/fine_tuning/alpha/graders/run"
LIMIT = 10
"""The most files following one grader may take (issue 25)."""

ITEM = {
    "reference_answer": "42",
    "references": {"answer": "42"},
    "messages": [{"role": "user", "content": "6 * 7?"}],
}
STRING_CHECK = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "operation": "eq",
}
TEXT_SIMILARITY = {
    "type": "text_similarity",
    "name": "close",
    "input": "{{sample.output_text}}",
    "reference": "{{item.reference_answer}}",
    "evaluation_metric": "fuzzy_match",
}
JUDGE_MESSAGES = [{"role": "user", "content": "Is {{sample.output_text}} the answer {{item.reference_answer}}?"}]
GRADERS: dict[str, dict[str, Any]] = {
    "string_check": STRING_CHECK,
    "text_similarity": TEXT_SIMILARITY,
    "multi": {
        "type": "multi",
        "name": "both",
        "graders": {"exact": STRING_CHECK, "close": TEXT_SIMILARITY},
        "calculate_output": "0.5 * exact + 0.5 * close",
    },
    "python": {"type": "python", "name": "code", "source": "def grade(sample, item):\n    return 1.0\n"},
    "score_model": {"type": "score_model", "name": "judge", "model": "judge", "input": JUDGE_MESSAGES},
    "label_model": {
        "type": "label_model",
        "name": "labels",
        "model": "judge",
        "input": JUDGE_MESSAGES,
        "labels": ["yes", "no"],
        "passing_labels": ["yes"],
    },
    "preset": {"type": "preset", "name": "exact_match"},
    "vertex": {
        "stringMatchRewardScorer": {
            "stringMatchExpression": {"matchOperation": "EXACT_MATCH", "expression": "{{references.answer}}"}
        }
    },
}
"""One grader of each OpenAI type and one reward of each other kind that needs nothing outside the service
(``graders/run`` takes any reward configuration, docs/rewards.md); the judges answer from ``judge_server``."""


class _CallPath:
    """Records the source files of the functions called under ``handler`` (or on a thread named
    ``pool_prefix...``), through ``sys.setprofile`` on every thread."""

    def __init__(self, handler, pool_prefix: str):
        self.handler = handler
        self.pool_prefix = pool_prefix
        self.files: list[str] = []
        self.recording = False

    def _under_handler(self, frame) -> bool:
        if threading.current_thread().name.startswith(self.pool_prefix):
            return True
        while frame is not None:
            if frame.f_code is self.handler:
                return True
            frame = frame.f_back
        return False

    def profile(self, frame, event, arg) -> None:
        if not self.recording or event != "call" or frame.f_code.co_name == "<module>":
            return
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(SOURCE) and self._under_handler(frame):
            name = str(path.relative_to(SOURCE))
            if name not in self.files:
                self.files.append(name)

    def __enter__(self) -> _CallPath:
        threading.setprofile(self.profile)  # threads started from here on: the client's loop, the pool
        sys.setprofile(self.profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


class _Judge(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat completions endpoint whose judge always passes: the structured answer
    ``{"steps": [], "result": ...}`` with the first label its schema allows, or 1 for a score."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        schema = request.get("response_format", {}).get("json_schema", {}).get("schema", {})
        result = schema.get("properties", {}).get("result", {}).get("enum", [1])[0]
        content = json.dumps({"steps": [], "result": result})
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@contextlib.contextmanager
def judge_server() -> Iterator[str]:
    """The judges' endpoint on 127.0.0.1 for as long as the block runs, as ``$OPENRFT_JUDGE_BASE_URL``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    before = os.environ.get("OPENRFT_JUDGE_BASE_URL")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    os.environ["OPENRFT_JUDGE_BASE_URL"] = url
    try:
        yield url
    finally:
        if before is None:
            os.environ.pop("OPENRFT_JUDGE_BASE_URL", None)
        else:
            os.environ["OPENRFT_JUDGE_BASE_URL"] = before
        server.shutdown()
        server.server_close()


def walks(graders: dict[str, dict[str, Any]], tenant: bool = False) -> dict[str, dict[str, Any]]:
    """Per grader: the files visited (``visited``, in order), their number and the reward answered."""
    from fastapi.testclient import TestClient

    from openrft.service import routes_openai
    from openrft.service.app import create_app
    from openrft.service.config import ServiceConfig
    from openrft.service.store import Store

    with tempfile.TemporaryDirectory() as folder:
        config = ServiceConfig.build(Path(folder) / "data", f"sqlite:///{folder}/openrft.db")
        store = Store.open(config.database_url)
        headers = {}
        if tenant:
            headers = {"Authorization": f"Bearer {store.create_key('walker')[1]}"}
            config = ServiceConfig.build(Path(folder) / "data", config.database_url, host="0.0.0.0")
        results = {}
        path = _CallPath(routes_openai.run_grader.__code__, "openrft-graders")
        try:
            with judge_server(), path, TestClient(create_app(config, store)) as client:
                for name, grader in graders.items():
                    body = {"grader": grader, "model_sample": "42", "item": ITEM}
                    client.post(ROUTE, json=body, headers=headers).raise_for_status()  # warm: imports, caches
                    path.files, path.recording = [], True
                    answer = client.post(ROUTE, json=body, headers=headers)
                    path.recording = False
                    answer.raise_for_status()
                    results[name] = {"files": len(path.files), "reward": answer.json()["reward"], "visited": path.files}
        finally:
            store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tenant", action="store_true", help="post with a tenant's API key to a non-loopback app")
    args = parser.parse_args()
    results = walks(GRADERS, tenant=args.tenant)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, result in results.items():
        print(f"{name}: {result['files']} files (reward {result['reward']:.3g})")
        for path in result["visited"]:
            print(f"  {path}")


if __name__ == "__main__":
    main()
