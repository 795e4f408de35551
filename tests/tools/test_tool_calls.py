"""Tool calls parsed from hand-written outputs in each open model's format, rendered by tool-aware chat
templates, and scored by OpenAI tool-call graders through ``sample.output_tools``."""

import json

import pytest

from openrft.data.records import Example
from openrft.models import load_tokenizer
from openrft.rewards import RewardSample
from openrft.rewards.kinds.nova_lambda import nova_entry
from openrft.rewards.kinds.openai_graders import openai_sample
from openrft.rollout.prompts import render_prompt
from openrft.rollout.tool_calls import parse_tool_calls
from tests.rewards.helpers import scores
from tests.tools.templates import HERMES, LLAMA3

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMES = {"get_weather", "get_time"}
PARIS = '{"city": "Paris"}'


def calls(text: str, names=NAMES) -> list[tuple[str, dict]]:
    parsed = parse_tool_calls(text, names)
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls]


@pytest.mark.parametrize(
    "text",
    [
        # Qwen2.5 / Qwen3 / Hermes
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',  # stopped before the closing tag
        # Qwen3-Coder XML body
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        # Llama 3.x JSON, tagged or bare, "parameters" or "arguments"
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        # Llama 3.2 / 4 pythonic
        '[get_weather(city="Paris")]',
        # Mistral, old and new
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        # DeepSeek-V3 / R1 (a fenced body after the type and the name), DeepSeek-V3.1 (NAME<sep>ARGS)
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
        # Phi-4-mini
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    ],
)
def test_one_call_in_every_format(text):
    parsed = parse_tool_calls(text, NAMES, id_prefix="call_3_")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    call = parsed.calls[0]
    assert call["id"] == "call_3_0" and call["type"] == "function"
    assert isinstance(call["function"]["arguments"], str)  # OpenAI gives arguments as a JSON string
    assert parsed.malformed == []
    assert "get_weather" not in parsed.content


def test_several_calls_keep_their_order_and_the_content():
    text = (
        'Checking both.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    parsed = parse_tool_calls(text, NAMES)
    assert [c["function"]["name"] for c in parsed.calls] == ["get_weather", "get_time"]
    assert [c["id"] for c in parsed.calls] == ["call_0", "call_1"]
    assert parsed.content == "Checking both."
    two = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'
    assert calls(two) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert calls('[get_weather(city="Paris"), get_time()]') == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_several_deepseek_and_phi_calls():
    deepseek = (
        "Both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n'
        "{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )
    assert calls(deepseek) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert parse_tool_calls(deepseek, NAMES).content == "Both."
    phi = 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
    assert calls(phi) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    broken = parse_tool_calls("<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{city<｜tool▁call▁end｜>", NAMES)
    assert broken.calls == [] and len(broken.malformed) == 1


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
        "<|python_tag|>" + "[" * 100_000,
        "[" * 100_000 + "]" * 100_000,
        "[get_weather(city=" + "[" * 100_000 + ")]",
        "<|channel|>commentary to=functions.get_weather <|message|>" + "[" * 100_000 + "]" * 100_000,
        '{"name": "get_weather", "arguments": "' + "[" * 100_000 + '"}',
    ],
)
def test_deeply_nested_brackets_are_no_call_and_no_crash(text):
    """json and ast raise RecursionError (not ValueError) on deep nesting; that ended jobs."""
    parsed = parse_tool_calls(text, NAMES)
    assert parsed.calls == []


def test_text_that_is_no_call_stays_text():
    for text in ["It is sunny in Paris.", '{"name": "Bob", "parameters": {}}', "[1, 2, 3]", "[print(1)]", ""]:
        parsed = parse_tool_calls(text, NAMES)
        assert parsed.calls == [] and parsed.malformed == [] and parsed.content == text
    # untagged calls need the row to offer tools at all
    assert parse_tool_calls('{"name": "get_weather", "parameters": {}}', ()).calls == []


def test_a_broken_call_is_reported_not_dropped():
    parsed = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>', NAMES)
    assert parsed.calls == []
    assert parsed.malformed == ['<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>']
    parsed = parse_tool_calls("<|python_tag|>get_weather(Paris)", NAMES)
    assert parsed.calls == [] and parsed.malformed == ["<|python_tag|>get_weather(Paris)"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("openrft-demo")


@pytest.mark.parametrize(("template", "end_of_turn"), [(HERMES, "<|im_end|>"), (LLAMA3, "<|eot_id|>")])
def test_chat_templates_render_the_rows_tools(tokenizer, template, end_of_turn):
    tokenizer.chat_template = template
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with_tools = tokenizer.decode(render_prompt(tokenizer, messages, [WEATHER, TIME]))
    without = tokenizer.decode(render_prompt(tokenizer, messages, None))
    schema = json.dumps(WEATHER["function"]["parameters"])
    assert '"name": "get_weather"' in with_tools and '"description": "Current weather of a city"' in with_tools
    assert schema in with_tools and "get_time" in with_tools
    assert "get_weather" not in without
    # an assistant turn with tool_calls and the tool's result render back in the template's own shape
    history = [
        *messages,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": PARIS}}],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
    ]
    rendered = tokenizer.decode(render_prompt(tokenizer, history, [WEATHER]))
    assert "sunny" in rendered
    # what the template writes for a call parses back to that call
    written = rendered.split(without[-20:])[1].split(end_of_turn)[0]
    assert calls(written) == [("get_weather", {"city": "Paris"})]


def row(**fields) -> Example:
    return Example(
        id="w1",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        fields={"expected_tool": "get_weather", "city": "Paris", **fields},
        tools=[WEATHER, TIME],
    )


def tool_check(input_: str, reference: str) -> dict:
    grader = {"type": "string_check", "name": "tool", "input": input_, "reference": reference, "operation": "eq"}
    return {"type": "openai_grader", "grader": grader}


OUTPUTS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',  # Qwen / Hermes
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',  # Llama 3.x
    '[get_weather(city="Paris")]',  # Llama 3.2 pythonic
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',  # the wrong tool
]


def test_tool_call_graders_score_output_tools():
    name = tool_check("{{sample.output_tools[0].function.name}}", "{{item.expected_tool}}")
    assert scores(name, OUTPUTS, row()) == [1.0, 1.0, 1.0, 0.0]
    arguments = tool_check("{{sample.output_tools[0].function.arguments}}", PARIS)
    assert scores(arguments, OUTPUTS[:3], row()) == [1.0, 1.0, 1.0]
    # no call: the variable is missing, an invalid_output error, never a silent 0
    assert scores(name, ["It is sunny."], row()) == ["invalid_output"]


def test_python_graders_and_lambdas_see_the_calls():
    source = (
        "import json\n"
        "def grade(sample, item):\n"
        "    calls = sample['output_tools']\n"
        "    if not calls: return 0.0\n"
        "    args = json.loads(calls[0]['function']['arguments'])\n"
        "    return float(calls[0]['function']['name'] == item['expected_tool'] and args['city'] == item['city'])\n"
    )
    python = {"type": "openai_grader", "grader": {"type": "python", "name": "p", "source": source}}
    assert scores(python, [*OUTPUTS, "It is sunny."], row()) == [1.0, 1.0, 1.0, 0.0, 0.0]

    sample = RewardSample(row(), 'Sure. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert openai_sample(sample)["output_text"] == "Sure."
    last = nova_entry(sample)["messages"][-1]
    assert last["role"] == "assistant" and last["content"] == "Sure."
    assert last["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}
    # a row without tools: the output is the answer, whatever it looks like
    plain = RewardSample(Example(id="p", messages=row().messages), '{"name": "get_weather", "parameters": {}}')
    assert plain.output_tools == [] and plain.output_text == plain.completion
