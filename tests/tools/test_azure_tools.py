"""Azure OpenAI's agentic RFT fields in OpenAI-dialect jobs: ``method.reinforcement.tools: [{name, server_url,
headers}]`` and ``max_episode_steps``, run by the HTTP tool loop with Azure's tool-server contract.

The shapes are Azure's as its fine-tuning samples document them (microsoft-foundry/fine-tuning,
Demos/Agentic_RFT_ToolCall_EndpointGrader): the server is POSTed a Responses ``function_call`` item and answers a
``function_call_output`` item; a reply over 1 MB is a 413 the model sees, a 4xx's body goes to the model, a 5xx is
retried. The tool servers here are our own, on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from openrft.spec.call_options import SandboxSpec
from openrft.spec.dialects import parse_document
from openrft.spec.errors import SpecError
from openrft.spec.tools import ToolsSpec
from openrft.tools.results import CallContext
from openrft.tools.runners import FUNCTION_CALL_BYTES, ToolBox

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator"
SECRET = "tenant-token-5f1c"


class ToolServer(BaseHTTPRequestHandler):
    """A calculator tool server in Azure's contract; ``script`` holds statuses to answer first (500, 404, ...)
    and ``oversize`` makes the next answer bigger than 1 MB."""

    calls: ClassVar[list[dict[str, Any]]] = []
    script: ClassVar[list[int]] = []
    oversize: ClassVar[bool] = False

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        ToolServer.calls.append({"body": body, "headers": {k.lower(): v for k, v in self.headers.items()}})
        if ToolServer.script:
            status = ToolServer.script.pop(0)
            self._send(status, {"error": {"message": f"no such expression ({status})"}})
            return
        sys.path.insert(0, str(EXAMPLE))
        from calculator import calculator

        output = str(calculator(**json.loads(body["arguments"])))
        if ToolServer.oversize:
            output = "9" * (FUNCTION_CALL_BYTES + 10)
        self._send(
            200, {"type": "function_call_output", "call_id": body["call_id"], "output": output, "id": body["id"]}
        )

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def tool_url():
    ToolServer.calls, ToolServer.script, ToolServer.oversize = [], [], False
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ToolServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/api/tools"
    httpd.shutdown()
    httpd.server_close()


def openai_job(tools: list[dict[str, Any]], **reinforcement: Any) -> dict[str, Any]:
    return {
        "model": "openrft-demo",
        "training_file": str(EXAMPLE / "train.jsonl"),
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": {"type": "string_check", "name": "x", "input": "a", "reference": "a", "operation": "eq"},
                "tools": tools,
                **reinforcement,
            },
        },
    }


def test_the_fields_map_onto_http_tools_with_azures_contract(tool_url):
    tools = [{"name": "calculator", "server_url": tool_url, "headers": {"X-Functions-Key": SECRET}}]
    spec = parse_document(openai_job(tools, max_episode_steps=3), "openai", EXAMPLE, None)
    runner = spec.tools.functions["calculator"]
    assert (runner.url, runner.contract, runner.headers) == (tool_url, "function_call", {"X-Functions-Key": SECRET})
    assert spec.tools.max_turns == 3
    assert (runner.remote.timeout_s, runner.remote.max_retries) == (600.0, 3)  # Azure's 10 minutes, 3 retries


@pytest.mark.parametrize(
    ("tools", "extra", "field"),
    [
        ([{"name": "calculator", "server_url": "ftp://x/tools"}], {}, "method.reinforcement.tools[0].server_url"),
        ([{"name": "a b", "server_url": "http://127.0.0.1:1/t"}], {}, "method.reinforcement.tools[0].name"),
        ([{"name": "t", "url": "http://127.0.0.1:1/t"}], {}, "method.reinforcement.tools[0]"),
        ([{"name": "t", "server_url": "http://127.0.0.1:1/t", "headers": {"k": 1}}], {}, "headers"),
        ([{"name": "t", "server_url": "http://127.0.0.1:1/t"}] * 2, {}, "method.reinforcement.tools[1].name"),
        ([{"name": "t", "server_url": "http://127.0.0.1:1/t"}], {"max_episode_steps": 0}, "max_episode_steps"),
        ([], {}, "method.reinforcement.tools"),
    ],
)
def test_bad_fields_are_refused_naming_them(tools, extra, field):
    with pytest.raises(SpecError) as error:
        parse_document(openai_job(tools, **extra), "openai", EXAMPLE, None)
    assert any(field in p.path for p in error.value.problems), error.value.problems


def call(tool_url: str, **remote: Any):
    spec = ToolsSpec.model_validate(
        {
            "functions": {
                "calculator": {
                    "type": "http",
                    "url": tool_url,
                    "contract": "function_call",
                    "headers": {"X-Functions-Key": SECRET},
                    "remote": {"max_retries": 3, "backoff_initial_s": 0.01, "backoff_max_s": 0.02, **remote},
                }
            }
        }
    )

    async def go():
        box = await ToolBox(spec, SandboxSpec()).start()
        try:
            context = CallContext(example_id="e1", episode_id="ep7", turn=1, messages=[])
            return await box.call("calculator", {"expression": "6*7"}, "call_1", {"calculator"}, context)
        finally:
            await box.aclose()

    return asyncio.run(go())


def test_the_server_gets_a_function_call_with_the_headers_and_its_output_is_the_result(tool_url):
    result = call(tool_url)
    assert (result.content, result.error_kind) == ("42", None)
    (seen,) = ToolServer.calls
    assert seen["body"] == {
        "type": "function_call",
        "id": "fc_call_1",
        "call_id": "call_1",
        "name": "calculator",
        "arguments": '{"expression": "6*7"}',
        "trace_id": "trace_ep7",
    }
    assert seen["headers"]["x-functions-key"] == SECRET


def test_a_5xx_is_retried(tool_url):
    ToolServer.script = [500, 503]
    result = call(tool_url)
    assert result.content == "42" and len(ToolServer.calls) == 3


def test_a_4xx_is_shown_to_the_model_and_the_episode_goes_on(tool_url):
    ToolServer.script = [404]
    result = call(tool_url)
    assert result.error_kind == "tool_error" and not result.fatal and len(ToolServer.calls) == 1
    assert "HTTP 404" in result.content and "no such expression (404)" in result.content


def test_a_reply_over_1_mb_is_a_413_shown_to_the_model(tool_url):
    ToolServer.oversize = True
    result = call(tool_url)
    assert result.error_kind == "tool_error" and not result.fatal
    assert result.content.startswith("error: HTTP 413") and len(ToolServer.calls) == 1  # not retried


def test_a_call_over_1_mb_is_not_sent(tool_url):
    spec = ToolsSpec.model_validate(
        {"functions": {"calculator": {"type": "http", "url": tool_url, "contract": "function_call"}}}
    )

    async def go():
        box = await ToolBox(spec, SandboxSpec()).start()
        try:
            context = CallContext(example_id="e1", episode_id="ep7", turn=1, messages=[])
            return await box.call("calculator", {"expression": "1" * FUNCTION_CALL_BYTES}, "c", {"calculator"}, context)
        finally:
            await box.aclose()

    result = asyncio.run(go())
    assert result.content.startswith("error: HTTP 413") and ToolServer.calls == []


def test_the_headers_never_reach_mlflow_params_or_spec_explain(tool_url):
    from openrft.engine.mlflow_tracking import flatten
    from openrft.spec.tools import masked_headers

    tools = [{"name": "calculator", "server_url": tool_url, "headers": {"X-Functions-Key": SECRET}}]
    spec = parse_document(openai_job(tools), "openai", EXAMPLE, None)
    shown = json.dumps(flatten(masked_headers(spec.model_dump(mode="json"))))
    assert SECRET not in shown and "X-Functions-Key" in shown


def test_spec_explain_shows_the_headers_masked(tool_url, tmp_path, capsys):
    from openrft.cli import main

    tools = [{"name": "calculator", "server_url": tool_url, "headers": {"X-Functions-Key": SECRET}}]
    job = tmp_path / "job.json"
    job.write_text(json.dumps(openai_job(tools)))
    for args in (["--json"], ["--all"]):
        assert main(["spec", "explain", str(job), *args]) == 0
        shown = capsys.readouterr().out
        assert SECRET not in shown
        if args == ["--json"]:
            assert json.loads(shown)["tools"]["functions"]["calculator"]["headers"] == {"X-Functions-Key": "***"}
