"""``openrft spec validate`` renders a two-turn tool episode with the job's model template before any training."""

from __future__ import annotations

import json
import shutil

from openrft.cli import main
from tests.tools.families import TEMPLATES
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


def test_a_template_that_raises_on_the_call_ids_is_reported(tmp_path, capsys):
    strict = (
        (EXAMPLE / "model" / "chat_template.jinja")
        .read_text()
        .replace(
            "{%- for call in message.tool_calls or [] %}",
            "{%- for call in message.tool_calls or [] %}{%- if call.id | length != 5 %}"
            "{{- raise_exception('Tool call IDs must be 5 characters') }}{%- endif %}",
        )
    )
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
