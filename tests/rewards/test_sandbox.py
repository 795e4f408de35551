"""The sandbox's guarantees: each test fails if the guarantee breaks."""

import asyncio
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from openrft.calls.sandbox import SandboxPool
from openrft.spec.rewards import SandboxSpec
from tests.rewards.helpers import ROOT, require_bwrap, score

USER_CODE = f"""
import os, socket
def ok(x):
    return x * 2
def connect(port):
    socket.create_connection(("127.0.0.1", port), timeout=2).sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    return 1.0
def outside():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("8.8.8.8", 53))
    return 1.0
def passwd():
    return open("/etc/passwd").read()
def project():
    return open({str(ROOT / "pyproject.toml")!r}).read()
def home():
    return os.listdir("/root")
def write_outside():
    open("/usr/lib/evil", "w").write("x")
def write_scratch():
    with open("note.txt", "w") as f:
        f.write("hi")
    return open(os.path.join(os.getcwd(), "note.txt")).read()
def allocate():
    return len(bytearray(3 << 30))
def spin():
    while True:
        pass
def fork_and_spin():
    if os.fork() == 0:
        while True:
            pass
    while True:
        pass
"""


@pytest.fixture(scope="module")
def pool_factory():
    require_bwrap()

    def make(**kwargs):
        return SandboxPool(SandboxSpec(workers=1, memory_limit_mb=1024, **kwargs))

    return make


def run(pool: SandboxPool, calls: list[tuple[str, list]], limit: float = 5.0):
    async def go():
        try:
            return [await pool.call(USER_CODE, entry, args, limit) for entry, args in calls]
        finally:
            await pool.aclose()

    return asyncio.run(go())


class _Hits(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self):
        _Hits.hits += 1
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_no_network_even_to_the_hosts_loopback(pool_factory):
    server = HTTPServer(("127.0.0.1", 0), _Hits)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        with socket.create_connection(("127.0.0.1", port)) as s:  # reachable from outside the sandbox
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            s.recv(100)
        before = _Hits.hits
        local, remote, after = run(pool_factory(), [("connect", [port]), ("outside", []), ("ok", [21])])
    finally:
        server.shutdown()
    assert local.kind == "runtime_error" and "Connection refused" in local.message
    assert remote.kind == "runtime_error" and "unreachable" in remote.message.lower()
    assert _Hits.hits == before
    assert after.ok and after.value == 42


def test_no_files_outside_the_scratch_directory(pool_factory):
    assert Path("/etc/passwd").exists() and (ROOT / "pyproject.toml").exists()
    passwd, project, home, write, scratch, after = run(
        pool_factory(),
        [("passwd", []), ("project", []), ("home", []), ("write_outside", []), ("write_scratch", []), ("ok", [1])],
    )
    assert passwd.kind == "runtime_error" and "FileNotFoundError" in passwd.message
    assert project.kind == "runtime_error" and "FileNotFoundError" in project.message
    assert home.ok and home.value in ([], [".pyenv"])  # at most the Python installation's own directory
    assert write.kind == "runtime_error" and ("Read-only" in write.message or "Permission" in write.message)
    assert scratch.ok and scratch.value == "hi"
    assert after.ok and after.value == 2


def test_memory_limit_and_the_pool_keeps_serving(pool_factory):
    pool = pool_factory()
    t0 = time.monotonic()
    allocation, after = run(pool, [("allocate", []), ("ok", [5])])
    assert allocation.kind == "runtime_error" and "memory limit" in allocation.message
    assert after.ok and after.value == 10
    assert pool.restarts == 1
    assert time.monotonic() - t0 < 10


def test_time_limit_kills_the_whole_sandbox(pool_factory):
    pool = pool_factory()
    t0 = time.monotonic()
    spin, forked, after = run(pool, [("spin", []), ("fork_and_spin", []), ("ok", [3])], limit=1.0)
    assert spin.kind == "timeout" and forked.kind == "timeout"
    assert time.monotonic() - t0 < 8
    assert after.ok and after.value == 6
    assert pool.restarts == 2


def test_python_grader_errors_by_kind_and_weak_isolation_is_flagged():
    require_bwrap()
    source = (
        "def grade(sample, item):\n"
        "    text = sample['output_text']\n"
        "    if text == 'loop':\n        while True: pass\n"
        "    if text == 'raise':\n        raise ValueError('bad sample')\n"
        "    if text == 'str':\n        return 'high'\n"
        "    if text == 'nan':\n        return float('nan')\n"
        "    return len(text) / 10 + (1 if item['reference_answer'] in text else 0)\n"
    )
    grader = {"type": "openai_grader", "grader": {"type": "python", "name": "p", "source": source}}
    outcomes = score(grader, ["5", "loop", "raise", "str", "nan", "55"], sandbox={"time_limit_s": 1.0, "workers": 2})
    assert [o.score if o.ok else o.error_kind for o in outcomes] == [
        1.1,
        "timeout",
        "runtime_error",
        "invalid_output",
        "invalid_output",
        1.2,
    ]
    assert "bad sample" in outcomes[2].error_message
    assert all("sandbox_weak" not in o.metrics for o in outcomes)
    weak = score(grader, ["5"], sandbox={"isolation": "weak"})[0]
    assert weak.score == 1.1 and weak.metrics["sandbox_weak"] == 1.0


def test_strict_isolation_refuses_to_run_without_bubblewrap(monkeypatch):
    from openrft.calls.sandbox import mechanism
    from openrft.spec.errors import SpecError

    monkeypatch.setattr(mechanism, "bwrap_path", lambda: None)
    mechanism.strict_unavailable.cache_clear()
    try:
        grader = {
            "type": "openai_grader",
            "grader": {"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 1\n"},
        }
        with pytest.raises(SpecError, match=r"bubblewrap \(bwrap\) is not installed.*isolation: weak"):
            score(grader, ["x"])
    finally:
        mechanism.strict_unavailable.cache_clear()


def test_user_code_problems_are_found_before_running():
    from openrft.spec.errors import SpecError

    def code(source):
        return {"type": "vertex", "single": {"codeExecutionRewardScorer": {"pythonCodeSnippet": source}}}

    with pytest.raises(SpecError, match="pythonCodeSnippet: is not valid Python: line 1"):
        score(code("def evaluate(example, response) return 1"), ["x"])
    with pytest.raises(SpecError, match=r"defines no top-level function evaluate\(\)"):
        score(code("def grade(sample, item):\n    return 1\n"), ["x"])
    with pytest.raises(SpecError, match=r"defines evaluate\(\) with 1 argument"):
        score(code("def evaluate(example):\n    return 1\n"), ["x"])
