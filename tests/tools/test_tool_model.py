"""The calculator example's model and data, and the script that builds them."""

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from openrft.rollout.prompts import render_prompt
from openrft.rollout.tool_calls import parse_tool_calls
from tests.tools.builders import build_twice, digest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_tool_model.py"
EXAMPLE = ROOT / "examples" / "calculator"


def test_the_calculator_model_is_small_and_its_template_renders_the_tools():
    model = AutoModelForCausalLM.from_pretrained(EXAMPLE / "model")
    tokenizer = AutoTokenizer.from_pretrained(EXAMPLE / "model")
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert sum(f.stat().st_size for f in (EXAMPLE / "model").iterdir()) < 5 * 2**20
    row = [{"role": "user", "content": "What is 347*29?"}]
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"properties": {"expression": {}}}}}]
    assert tokenizer.decode(render_prompt(tokenizer, row, tools)) == (
        "<|im_start|>system\nTools: calculator(expression)<|im_end|>\n"
        "<|im_start|>user\nWhat is 347*29?<|im_end|>\n<|im_start|>assistant\n"
    )
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "347*29"}}</tool_call>'
    assert len(tokenizer(call, add_special_tokens=False)["input_ids"]) == len(call) - 10 - 11  # each tag is one token
    assert tokenizer.decode(tokenizer(call)["input_ids"], skip_special_tokens=True) == call
    assert parse_tool_calls(call, {"calculator"}).calls[0]["function"]["name"] == "calculator"


@pytest.mark.slow
def test_rebuilding_is_byte_identical_and_writes_the_committed_data(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    build_twice(SCRIPT, ["--steps", "3"], a, b, timeout_s=600)
    assert digest(a / "model" / "model.safetensors") == digest(b / "model" / "model.safetensors")
    for name in ("train.jsonl", "validation.jsonl"):
        assert digest(a / name) == digest(EXAMPLE / name)
