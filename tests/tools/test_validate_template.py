"""``openrft spec validate`` renders a two-turn tool episode with the job's model template before any training."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from openrft.cli import main
from openrft.tools.continuation import template_problems
from tests.tools.families import FAMILIES, TEMPLATES, Family, family_id
from tests.tools.scripted import CALCULATOR_TOOL
from tests.tools.test_train_tools import EXAMPLE, tools_recipe


def model_with_template(tmp_path, template: str):
    model = tmp_path / "model"
    shutil.copytree(EXAMPLE / "model", model)
    (model / "chat_template.jinja").write_text(template)
    return model


def validate(tmp_path, model, capsys) -> dict:
    recipe = tools_recipe(tmp_path)
    text = recipe.read_text().replace(str(EXAMPLE / "model"), str(model)).replace("max_length: 192", "max_length: 1024")
    recipe.write_text(text)
    code = main(["spec", "validate", str(recipe), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if report["valid"] else 1)
    return report


def test_the_calculator_template_can_continue_tool_episodes(tmp_path, capsys):
    report = validate(tmp_path, EXAMPLE / "model", capsys)
    assert report["valid"] and report["prompts_checked"]


def strict_ids_template() -> str:
    return (
        (EXAMPLE / "model" / "chat_template.jinja")
        .read_text()
        .replace(
            "{%- for call in message.tool_calls or [] %}",
            "{%- for call in message.tool_calls or [] %}{%- if call.id | length != 5 %}"
            "{{- raise_exception('Tool call IDs must be 5 characters') }}{%- endif %}",
        )
    )


def test_a_template_that_raises_on_the_call_ids_is_reported(tmp_path, capsys):
    strict = strict_ids_template()
    assert strict != (EXAMPLE / "model" / "chat_template.jinja").read_text()
    report = validate(tmp_path, model_with_template(tmp_path, strict), capsys)
    assert not report["valid"]
    (problem,) = report["problems"]
    assert "tool episode at turn 1" in problem and "Tool call IDs must be 5 characters" in problem


def test_a_template_that_drops_tool_results_is_reported(tmp_path, capsys):
    mute = (
        (EXAMPLE / "model" / "chat_template.jinja")
        .read_text()
        .replace("message.content + '</tool_response>", "'</tool_response>")
    )
    assert mute != (EXAMPLE / "model" / "chat_template.jinja").read_text()
    report = validate(tmp_path, model_with_template(tmp_path, mute), capsys)
    (problem,) = report["problems"]
    assert "does not show a tool's result to the model" in problem


def test_mistral_shaped_templates_pass_with_the_episodes_call_ids(tmp_path, capsys):
    """The ids the episodes give (9 letters and digits) are what Mistral's templates require."""
    text = (TEMPLATES / "ministral.jinja").read_text()
    report = validate(tmp_path, model_with_template(tmp_path, text), capsys)
    assert report["valid"], report["problems"]


def test_openrft_train_runs_the_same_check_before_it_starts(tmp_path, capsys):
    """It used to start anyway and die at the first tool turn (DeepSeek's TypeError, issue 47)."""
    recipe = tools_recipe(tmp_path)
    model = model_with_template(tmp_path, strict_ids_template())
    recipe.write_text(recipe.read_text().replace(str(EXAMPLE / "model"), str(model)))
    code = main(["train", str(recipe), "--output", str(tmp_path / "run"), "--quiet"])
    error = capsys.readouterr().err
    assert code == 2 and "Tool call IDs must be 5 characters" in error and "tool episode at turn 1" in error
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_missing_tool_file_is_reported(tmp_path, capsys):
    """The calculator example with its tool file missing (or without the function) said valid."""
    recipe = tools_recipe(tmp_path)
    data = yaml.safe_load(recipe.read_text())
    data["openrft"]["tools"]["functions"]["calculator"]["function"] = "gone.py:calculator"
    recipe.write_text(yaml.safe_dump(data))
    code = main(["spec", "validate", str(recipe), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and not report["valid"]
    assert f"tools.functions.calculator.function: no file {tmp_path / 'gone.py'}" in report["problems"][0]
    (tmp_path / "gone.py").write_text("def add(a, b):\n    return a + b\n")
    code = main(["spec", "validate", str(recipe), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and "defines no function 'calculator'" in report["problems"][0]


@pytest.mark.parametrize("family", FAMILIES, ids=family_id)
def test_the_check_passes_every_family_template(family: Family):
    """DeepSeek's (arguments as a string) and Phi-4-mini's (tools in the system message; <|end|> then
    <|endoftext|> after a turn) included: what the template needs is given to it."""
    tokenizer = family.tokenizer()
    ends = [e for e in (family.special[0], family.call_end, family.answer_end) if e]
    messages = [{"role": "user", "content": "What is 347*29?"}]
    assert template_problems(tokenizer, messages, [CALCULATOR_TOOL], family.reasoning_effort, ends) == []


def test_an_unreachable_mcp_server_is_reported_by_its_url(tmp_path, capfd):
    """spec validate said valid; the job then failed with an ExceptionGroup naming neither. (capfd: a stdio
    server's stderr is a file descriptor, which capsys's stand-in has not.)"""
    pytest.importorskip("mcp")
    from tests.tools.test_mcp import free_port

    url = f"http://127.0.0.1:{free_port()}/mcp"
    recipe = tools_recipe(tmp_path)
    data = yaml.safe_load(recipe.read_text())
    data["openrft"]["tools"]["mcp_servers"] = {"search": {"url": url}}
    recipe.write_text(yaml.safe_dump(data))
    code = main(["spec", "validate", str(recipe), "--json"])
    report = json.loads(capfd.readouterr().out)
    assert code == 1
    (problem,) = report["problems"]
    assert problem.startswith(f"tools.mcp_servers.search ({url}): cannot connect: ConnectError"), problem
    server = Path(__file__).resolve().parent / "mcp_server.py"
    data["openrft"]["tools"]["functions"] = {}
    data["openrft"]["tools"]["mcp_servers"] = {"calc": {"command": [sys.executable, str(server), "calculator"]}}
    recipe.write_text(yaml.safe_dump(data))
    code = main(["spec", "validate", str(recipe), "--json"])
    report = json.loads(capfd.readouterr().out)
    assert code == 0 and report["valid"], report["problems"]
