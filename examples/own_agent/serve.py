"""The agent's entrypoint for training: an HTTP endpoint the job POSTs each trajectory to.

The job sends ``{"trajectory_id", "base_url", "api_key", "row", ...}`` (docs/agents.md); this runs the
unchanged agent (``agent.run``) with an ``openai`` client at that ``base_url`` on the row's question and
answers ``{"answer": ...}``. Returning is the trajectory's CompleteRollout; the job's grader scores the answer.

    python serve.py --port 8765
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent import run
from openai import DefaultHttpxClient, OpenAI


CONNECTIONS = DefaultHttpxClient()  # one connection pool for every trajectory's client (a client's own costs ~50 ms)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a step's trajectories arrive at once (http.server's default backlog is 5)


class Entrypoint(BaseHTTPRequestHandler):
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        client = OpenAI(
            base_url=request["base_url"], api_key=request["api_key"], max_retries=2, http_client=CONNECTIONS
        )
        try:
            answer, status = {"answer": run(client, request["row"]["messages"][-1]["content"])}, 200
        except Exception as exc:  # the trajectory failed: the job counts it and drops it
            answer, status = {"error": f"{type(exc).__name__}: {exc}"}, 500
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = Server((args.host, args.port), Entrypoint)
    print(f"agent entrypoint on http://{args.host}:{server.server_address[1]}/", flush=True)
    server.serve_forever()
