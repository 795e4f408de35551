"""Tool and reward endpoint calls are bounded (issue 24): a total deadline that includes the body (a server
sending a byte a second used to hold a job past its timeout_s, httpx's timeout being per read), a byte cap
on the answer (a 32 MB tool answer took a job process to 3.5 GB), tool content cut to the episode's token
budget, and a range on every call setting a tenant can send."""

from __future__ import annotations

import asyncio
import json
import resource
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pydantic
import pytest

from openrft.calls.endpoints import MAX_RESPONSE_BYTES, RemoteEndpoint
from openrft.spec.dialects.nova import NovaApiEndpoint
from openrft.spec.rewards import (
    GenerationConfig,
    GraderSamplingParams,
    JudgeSpec,
    NovaLambdaReward,
    RemoteCallSpec,
)
from openrft.spec.tools import ToolsSpec
from openrft.tools.runners import TOOL_RESPONSE_BYTES
from tests.tools.scripted import call
from tests.tools.test_episodes import Episodes, caller, tokenizer, use  # noqa: F401 (tokenizer: a fixture)

HUGE = 32 << 20


class Misbehaving(BaseHTTPRequestHandler):
    """/trickle: headers, then a byte every 0.25 s for 30 s; /huge: 32 MB of JSON (with its length);
    /huge-chunked: the same without a length; /long: a 400,000-character content; /ok: a small answer."""

    protocol_version = "HTTP/1.1"
    huge_body = b'{"content": "' + b"x" * HUGE + b'"}'  # made once, before any memory is measured

    def do_POST(self):
        received = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            if self.path in ("/deep", "/echo"):
                body = b"[" * 200_000 + b"]" * 200_000 if self.path == "/deep" else received
                self._start(length=len(body))
                self.wfile.write(body)
            elif self.path == "/trickle":
                self._start(length=120)
                for _ in range(120):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.25)
            elif self.path.startswith("/huge"):
                body = Misbehaving.huge_body
                if self.path == "/huge":
                    self._start(length=len(body))
                    self.wfile.write(body)
                else:
                    self._start(length=None)
                    view = memoryview(body)
                    for start in range(0, len(body), 1 << 16):
                        piece = bytes(view[start : start + (1 << 16)])
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
            else:
                content = "word " * 80_000 if self.path == "/long" else "7"
                body = json.dumps({"content": content}).encode()
                self._start(length=len(body))
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading: what the caps are for

    def _start(self, length: int | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def log_message(self, *args):
        return None


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def post_once(url: str, timeout_s: float, max_bytes: int = MAX_RESPONSE_BYTES, payload=None):
    spec = RemoteCallSpec(timeout_s=timeout_s, max_retries=0, circuit_failures=100)

    async def go():
        async with httpx.AsyncClient() as client:
            endpoint = RemoteEndpoint(url, spec, timeout_s, "endpoint", client, max_response_bytes=max_bytes)
            started = time.monotonic()
            try:
                answer = await endpoint.post_json({"x": 1} if payload is None else payload)
            except Exception as exc:  # RewardFailure
                return exc, time.monotonic() - started
            return answer, time.monotonic() - started

    return asyncio.run(go())


def test_a_reward_endpoint_trickling_its_body_times_out_at_its_deadline(server):
    failure, elapsed = post_once(f"{server}/trickle", timeout_s=1.0)
    assert failure.kind == "timeout" and "within 1 s" in failure.message
    assert elapsed < 5  # the body would have taken 30 s


@pytest.mark.parametrize("path", ["/huge", "/huge-chunked"])
def test_a_reward_endpoint_answer_past_the_byte_cap_is_invalid_output(server, path):
    before = peak_rss_mb()
    failure, _ = post_once(f"{server}{path}", timeout_s=60.0, max_bytes=1 << 20)
    assert failure.kind == "invalid_output" and "cap of 1,048,576 bytes" in failure.message
    assert peak_rss_mb() - before < 64


def test_a_payload_with_a_lone_surrogate_travels_as_json(server):
    """A request's JSON may hold ``\\ud800``, which UTF-8 cannot encode: httpx's encoder raised
    UnicodeEncodeError out of the grader (a 500 of graders/run)."""
    answer, _ = post_once(f"{server}/echo", timeout_s=10.0, payload={"text": "a\ud800b 日本"})
    assert answer == {"text": "a\ud800b 日本"}


def test_a_payload_json_cannot_carry_is_invalid_output(server):
    failure, _ = post_once(f"{server}/echo", timeout_s=10.0, payload={"x": float("nan")})
    assert failure.kind == "invalid_output" and "NaN" in failure.message


def test_an_answer_nested_past_the_parser_is_invalid_output(server):
    """``json.loads`` raises RecursionError (not ValueError) on 200,000 brackets: it escaped the call."""
    failure, _ = post_once(f"{server}/deep", timeout_s=10.0)
    assert failure.kind == "invalid_output" and "not JSON" in failure.message


def tools(server: str, **remote) -> dict:
    remote = {"timeout_s": 1.0, "max_retries": 0, **remote}
    return {
        "functions": {
            name: {"type": "http", "url": f"{server}/{name}", "remote": remote}
            for name in ("trickle", "huge", "long", "ok")
        },
        "max_output_chars": None,  # the tenant turned truncation off: the token budget still holds
    }


def test_tool_calls_end_at_their_deadline_and_byte_cap(tokenizer, server):  # noqa: F811
    before = peak_rss_mb()
    with Episodes(tokenizer, caller, tools(server), [use("trickle"), use("huge"), use("ok")]) as episodes:
        started = time.monotonic()
        groups = episodes.run()
        elapsed = time.monotonic() - started
    trickle, huge, ok = (g[0] for g in groups)
    assert trickle.finish_reason == "tool_error" and trickle.metadata["tool_failure"][0] == "timeout"
    assert huge.finish_reason == "tool_error" and huge.metadata["tool_failure"][0] == "invalid_output"
    assert f"cap of {TOOL_RESPONSE_BYTES:,} bytes" in huge.metadata["tool_failure"][1]
    assert ok.finish_reason == "stop" and ok.text == "7"
    assert elapsed < 10  # the trickle alone would have taken 30 s
    assert peak_rss_mb() - before < 200  # 32 MB took the job process to 3.5 GB


def test_tool_content_is_cut_to_the_episodes_remaining_tokens(tokenizer, server):  # noqa: F811
    budget = 120
    with Episodes(tokenizer, caller, tools(server), [use("long")]) as episodes:
        ((episode,),) = episodes.run(budget=budget)
        generator = episodes.generator
    first_turn = len(tokenizer(call("3+4", "long"), add_special_tokens=False)["input_ids"]) + 1
    assert len(episode.token_ids) <= budget and episode.finish_reason == "length"
    assert generator._within_budget("word " * 80_000, budget - first_turn).count("word") <= budget - first_turn


@pytest.mark.parametrize(
    ("model", "field", "value", "bound"),
    [
        (RemoteCallSpec, "timeout_s", 1e9, "900"),
        (RemoteCallSpec, "backoff_initial_s", 1e9, "60"),
        (RemoteCallSpec, "backoff_max_s", 1e9, "300"),
        (RemoteCallSpec, "circuit_failures", 10**9, "1000"),
        (RemoteCallSpec, "max_concurrency", 10**9, "256"),
        (JudgeSpec, "max_concurrency", 10**9, "256"),
        (JudgeSpec, "max_tokens", 10**9, "32768"),
        (NovaApiEndpoint, "lambda_concurrency_limit", 10**9, "1000"),
        (NovaApiEndpoint, "lambda_batch_size", 10**9, "4096"),
        (NovaLambdaReward, "batch_size", 10**9, "4096"),  # the same settings as a reward config of their own
        (NovaLambdaReward, "concurrency_limit", 10**9, "1000"),
        (GraderSamplingParams, "max_completions_tokens", 10**9, "32768"),  # a judge's reply, as judge max_tokens
        (GenerationConfig, "maxOutputTokens", 10**9, "32768"),
    ],
)
def test_every_call_setting_a_tenant_sends_has_a_range(model, field, value, bound):
    required = {"endpoint": "http://example.com/"} if model is NovaLambdaReward else {}
    with pytest.raises(pydantic.ValidationError, match=f"less than or equal to {bound}"):
        model.model_validate({**required, field: value})


@pytest.mark.parametrize(
    ("document", "path"),
    [
        ({"functions": {"t": {"type": "python", "function": "t.py:f", "timeout_s": 1e9}}}, "timeout_s"),
        ({"functions": {"t": {"type": "http", "url": "http://x", "remote": {"timeout_s": 1e9}}}}, "timeout_s"),
        ({"max_concurrency": 10**9}, "max_concurrency"),
        ({"environment": {"module": "env.py", "timeout_s": 1e9}}, "timeout_s"),
    ],
)
def test_tool_settings_have_ranges(document, path):
    with pytest.raises(pydantic.ValidationError, match=f"{path}\n.*less than or equal to"):
        ToolsSpec.model_validate(document)
