"""Tool episodes sampled from a generation server (``generator_base_url``: ``openrft serve-model``, the vLLM
subset of the API): each turn is a token-id completion request, tools run in the job's process."""

from __future__ import annotations

import json

import pytest

from openrft.engine import RFTJob
from openrft.spec.dialects import load_job
from tests.server.serve_model import serve_model
from tests.tools.test_train_tools import EXAMPLE, rows, tools_recipe


@pytest.fixture
def tool_model_server(tmp_path):
    with serve_model(str(EXAMPLE / "model"), tmp_path / "server.log", "--allow-load-from", str(tmp_path)) as url:
        yield f"{url}/v1"


@pytest.mark.slow
def test_tool_episodes_through_a_generation_server(tmp_path, tool_model_server):
    recipe = tools_recipe(tmp_path, "off_policy_async", generator_base_url=tool_model_server)
    spec = load_job(recipe)
    summary = RFTJob(spec, tmp_path / "run", show_progress=False).run()
    assert summary["status"] == "succeeded"
    steps = rows(tmp_path / "run")[1:]
    called = [r for r in steps if r["tools/calls/total"] > 0]
    assert called and all(r["tools/failed_episodes"] == 0.0 for r in steps)
    assert called[0]["tools/masked_tokens/total"] > 0 and called[0]["tools/turns/max"] >= 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 3
