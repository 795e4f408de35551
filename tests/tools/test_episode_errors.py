"""No single episode ends a job (issue 47, point 5): a chat template that raises, a tool that raises or returns
what is not JSON, a parser that fails, an MCP server killed mid-job: each ends its own episode with a counted
error kind (metrics, recorded samples) and the job goes on, on the calculator example's model, two steps;
past ``tools.error_budget`` the job fails, naming the cause."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from openrft.engine import RFTJob
from openrft.engine.samples import read_samples
from openrft.spec.dialects import load_job
from openrft.tools.metrics import EpisodeErrorBudget
from tests.tools.test_train_tools import EXAMPLE, rows, tools_recipe

MCP_SERVER = Path(__file__).resolve().parent / "mcp_server.py"
RAISE_ON_LONG_RESULTS = (
    "{%- elif message.role == 'tool' %}{%- if message.content | length > 4 %}"
    "{{- raise_exception('This template shows tool results of at most 4 characters') }}{%- endif %}"
)
"""Raises for a result longer than 4 characters, as Llama 3.1/3.2's published templates raise for a turn with
two calls ("This model only supports single tool-calls at once!"): fine on the check ``openrft train`` runs
first (its results are 4 characters), failing on some episodes only (a product of 5 digits)."""


def two_steps(tmp_path: Path, **openrft) -> Path:
    """The calculator example, small: 4 prompts x 4 episodes a step, 8 validation episodes, two steps."""
    path = tools_recipe(tmp_path, sample_prompts_per_step=4, **openrft)  # every training sample recorded
    recipe = yaml.safe_load(path.read_text())
    recipe["training_config"]["trainer"].update(max_steps=2, save_steps=2)
    path.write_text(yaml.safe_dump(recipe))
    return path


def with_tools(path: Path, tools: dict) -> Path:
    recipe = yaml.safe_load(path.read_text())
    recipe["openrft"]["tools"].update(tools)
    path.write_text(yaml.safe_dump(recipe))
    return path


def run(path: Path, run_dir: Path) -> dict:
    return RFTJob(load_job(path), run_dir, show_progress=False).run()


def error_count(run_dir: Path, kind: str) -> float:
    """Episodes ended by ``kind`` over the job: training steps and evaluations."""
    return sum(
        r.get(f"tools/episode_errors/{kind}", 0) + r.get(f"val-score/tools/episode_errors/{kind}", 0)
        for r in rows(run_dir)
    )


def failed_samples(run_dir: Path, kind: str) -> list[dict]:
    return [r for r in read_samples(run_dir) if r["error_kind"] == kind]


def model_raising_on_long_results(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(EXAMPLE / "model", model)
    template = (model / "chat_template.jinja").read_text()
    strict = template.replace("{%- elif message.role == 'tool' %}", RAISE_ON_LONG_RESULTS)
    assert strict != template
    (model / "chat_template.jinja").write_text(strict)
    return model


def with_model(path: Path, model: Path) -> Path:
    path.write_text(path.read_text().replace(str(EXAMPLE / "model"), str(model)))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["lockstep", "independent"])  # independent: the continuous decode batch
def test_a_template_error_ends_its_episode_and_the_job_goes_on(tmp_path, schedule):
    recipe = with_model(two_steps(tmp_path), model_raising_on_long_results(tmp_path))
    with_tools(recipe, {"schedule": schedule})
    summary = run(recipe, tmp_path / "run")
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    assert error_count(tmp_path / "run", "template_error") > 0
    (sample, *_) = failed_samples(tmp_path / "run", "template_error")
    assert "chat template" in sample["error_message"] and "at most 4 characters" in sample["error_message"]
    assert sample["finish_reason"] == "tool_error" and sample["reward"] is None  # excluded, never a silent 0


@pytest.mark.slow
def test_past_the_error_budget_the_job_fails_naming_the_cause(tmp_path):
    recipe = with_model(two_steps(tmp_path), model_raising_on_long_results(tmp_path))
    with_tools(recipe, {"error_budget": 0.0})
    with pytest.raises(EpisodeErrorBudget, match=r"tools\.error_budget \(0\).*template_error.*at most 4 characters"):
        run(recipe, tmp_path / "run")
    assert failed_samples(tmp_path / "run", "template_error")  # the batch's samples are there to look at


FLAKY_TOOL = """
import sys
sys.path.insert(0, {example!r})
from calculator import calculator as evaluate


def calculator(expression):
    if "7" in expression:
        raise ValueError("no sevens today")
    if "3" in expression:
        return {{"a set": {{3}}}}  # not JSON
    return evaluate(expression)
"""


@pytest.mark.slow
def test_a_tool_that_raises_or_answers_no_json_ends_no_job(tmp_path):
    tool = tmp_path / "flaky.py"
    tool.write_text(FLAKY_TOOL.format(example=str(EXAMPLE)))
    recipe = two_steps(tmp_path)
    calculator = {"type": "python", "function": f"{tool}:calculator", "sandboxed": False}
    with_tools(recipe, {"functions": {"calculator": calculator}})
    summary = run(recipe, tmp_path / "run")
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    # a tool that raises: its error goes back to the model, counted, and the episode goes on
    assert sum(r.get("tools/calculator/errors", 0) for r in rows(tmp_path / "run")) > 0
    # a value that is not JSON: that episode ends, invalid_output
    assert error_count(tmp_path / "run", "invalid_output") > 0
    (sample, *_) = failed_samples(tmp_path / "run", "invalid_output")
    assert "tool calculator returned a value that is not JSON" in sample["error_message"]


@pytest.mark.slow
def test_a_parser_failure_ends_its_episode_and_the_job_goes_on(tmp_path, monkeypatch):
    """The parser raised RecursionError on deeply nested brackets (fixed in the parser, test_tool_calls); any
    failure of it now ends that episode only (``parse_error``). Injected here into every third turn."""
    import openrft.tools.episodes as episodes

    real, turns = episodes.parse_tool_calls, []

    def failing(text, names=(), id_prefix="call_"):
        turns.append(text)
        if len(turns) % 3 == 0:
            raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
        return real(text, names, id_prefix)

    monkeypatch.setattr(episodes, "parse_tool_calls", failing)
    summary = run(two_steps(tmp_path), tmp_path / "run")
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    assert error_count(tmp_path / "run", "parse_error") > 0
    (sample, *_) = failed_samples(tmp_path / "run", "parse_error")
    assert "could not be parsed: RecursionError" in sample["error_message"]


@pytest.mark.slow
def test_a_killed_mcp_server_is_restarted_for_the_next_episodes(tmp_path):
    """A stdio server that dies at its third call: the episodes whose calls it dropped end (``server_error``,
    naming the server's command), and a new process serves the next calls."""
    pytest.importorskip("mcp")
    recipe = two_steps(tmp_path)
    server = {"command": [sys.executable, str(MCP_SERVER), "calculator", "--die-after", "2"], "timeout_s": 20}
    recipe_data = yaml.safe_load(recipe.read_text())
    recipe_data["openrft"]["tools"]["functions"] = {}
    recipe_data["openrft"]["tools"]["mcp_servers"] = {"calc": server}
    recipe.write_text(yaml.safe_dump(recipe_data))
    summary = run(recipe, tmp_path / "run")
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    assert error_count(tmp_path / "run", "server_error") > 0
    (sample, *_) = failed_samples(tmp_path / "run", "server_error")
    assert (
        "MCP server calc (command " in sample["error_message"] and "mcp_server.py calculator" in sample["error_message"]
    )
    calls = sum(
        r.get("tools/calculator/calls", 0) + r.get("val-score/tools/calculator/calls", 0)
        for r in rows(tmp_path / "run")
    )
    errors = sum(
        r.get("tools/calculator/errors", 0) + r.get("val-score/tools/calculator/errors", 0)
        for r in rows(tmp_path / "run")
    )
    assert calls - errors > 2, "more calls answered than one process serves: the server was restarted"


def test_two_calls_in_a_llama_turn_end_that_episode_only():
    """Llama 3.1's template raises for a turn with two calls (OpenRFT parses ``a; b``): that episode ends
    with ``template_error`` naming the template's message; the other episode of the batch answers."""
    from openrft.data.records import Example
    from openrft.rollout.prompts import render_prompt
    from openrft.rollout.types import SamplingParams
    from openrft.spec.rewards import SandboxSpec
    from openrft.spec.tools import ToolsSpec
    from openrft.tools.episodes import RowPrompt, ToolGenerator, ToolService
    from tests.tools.families import FAMILIES, FamilyGenerator
    from tests.tools.scripted import CALCULATOR_TOOL
    from tests.tools.test_templates import TOOLS

    (family,) = [f for f in FAMILIES if f.name == "llama3_1"]
    tokenizer, eos = family.tokenizer(), family.special[0]

    def policy(context: str) -> tuple[str, str]:
        if "<|start_header_id|>ipython" in context:
            return "10063", eos
        if "twice" in context:
            return family.call("347*29") + "; " + family.call("347*29"), eos
        return family.call("347*29"), eos

    rows = [
        Example(id=id, messages=[{"role": "user", "content": text}], fields={}, tools=[CALCULATOR_TOOL])
        for id, text in (("twice", "What is 347*29, twice?"), ("once", "What is 347*29?"))
    ]
    prompts = [RowPrompt(render_prompt(tokenizer, r.messages, r.tools), r, i) for i, r in enumerate(rows)]
    service = ToolService(ToolsSpec.model_validate(TOOLS), SandboxSpec(isolation="weak"))
    try:
        generator = ToolGenerator(FamilyGenerator(tokenizer, policy), service, tokenizer, [tokenizer.eos_token_id])
        (twice,), (once,) = generator.generate(prompts, SamplingParams(n=1, max_new_tokens=2000))
    finally:
        service.close()
    kind, message = twice.metadata["tool_failure"]
    assert kind == "template_error" and "This model only supports single tool-calls at once!" in message
    assert "turn 1 (2 call(s): calculator, calculator)" in message and twice.finish_reason == "tool_error"
    assert "tool_failure" not in once.metadata and once.text == "10063"
