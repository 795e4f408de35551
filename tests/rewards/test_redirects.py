"""Reward endpoints cannot bounce a call onto another internal host: a redirect to another host with a
loopback, link-local or private address, or to another scheme, is not followed (a server_error)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from openrft.calls.outbound import redirect_refusal
from tests.rewards.helpers import FAST_REMOTE, scores


class _Scorer(BaseHTTPRequestHandler):
    hits = 0

    def do_POST(self):
        _Scorer.hits += 1
        samples = json.loads(self.rfile.read(int(self.headers["content-length"])))
        body = json.dumps([{"id": s["id"], "aggregate_reward_score": 0.5} for s in samples]).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _redirecting_to(location: str):
    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(307)
            self.send_header("location", location)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    return Redirect


@pytest.fixture
def serve():
    servers = []

    def start(handler) -> int:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return httpd.server_address[1]

    yield start
    for httpd in servers:
        httpd.shutdown()


def test_a_redirect_to_another_internal_host_is_not_followed(serve):
    scorer = serve(_Scorer)
    same_host = serve(_redirecting_to(f"http://127.0.0.1:{scorer}/"))
    other_host = serve(_redirecting_to(f"http://localhost:{scorer}/"))
    function = {"type": "nova_lambda", "endpoint": f"http://127.0.0.1:{same_host}/"}
    assert scores(function, ["a"], remote=FAST_REMOTE) == [0.5]  # a redirect on the same host is followed
    hits = _Scorer.hits
    function = {"type": "nova_lambda", "endpoint": f"http://127.0.0.1:{other_host}/"}
    assert scores(function, ["a"], remote=FAST_REMOTE) == ["server_error"]
    assert _Scorer.hits == hits  # the internal host behind the redirect was never called


def test_redirect_policy():
    assert redirect_refusal("http://93.184.216.34/a", "http://93.184.216.34/b") is None
    assert "internal address" in redirect_refusal("http://93.184.216.34/a", "http://169.254.169.254/latest")
    assert "not an http(s) URL" in redirect_refusal("http://93.184.216.34/a", "file:///etc/passwd")
