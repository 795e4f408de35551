"""Tool episodes through the chat templates of the families people train (the project's own templates in their
published shapes, tests/tools/chat_templates): three model turns each (two calls, then the answer), with the
tokens the template puts after each tool result computed from the template itself."""

from __future__ import annotations

import pytest

from openrft.data.records import Example
from openrft.rollout.prompts import TemplateNeeds, chat_text, render_prompt, template_needs
from openrft.rollout.types import SamplingParams
from openrft.spec.rewards import SandboxSpec
from openrft.spec.tools import ToolsSpec
from openrft.tools.continuation import ToolTemplateError, call_id, continuation_text
from openrft.tools.episodes import RowPrompt, ToolGenerator, ToolService, template_arguments
from tests.tools.families import FAMILIES, Family, FamilyGenerator, family_id
from tests.tools.scripted import CALCULATOR_TOOL, ROOT

CALCULATOR = ROOT / "examples" / "calculator" / "calculator.py"
TOOLS = {"functions": {"calculator": {"type": "python", "function": f"{CALCULATOR}:calculator", "sandboxed": False}}}
QUESTION = Example(
    id="q",
    messages=[{"role": "user", "content": "What is 347*29 plus 1?"}],
    fields={"reference_answer": "10064"},
    tools=[CALCULATOR_TOOL],
)


def policy(family: Family):
    """Calls the calculator for 347*29, then for that result plus 1, then answers with the second result."""
    eos = family.special[0]

    def turn(context: str) -> tuple[str, str]:
        if "10064" in context:
            return family.answer("10064"), family.answer_end or eos
        if "10063" in context:
            return family.call("10063+1"), family.call_end or eos
        return family.call("347*29"), family.call_end or eos

    return turn


def run_episode(family: Family, example: Example = QUESTION, tools: dict | None = None):
    tokenizer = family.tokenizer()
    ends = {family.special[0], family.call_end, family.answer_end} - {""}
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in ends]
    prompt = render_prompt(tokenizer, example.messages, example.tools, family.reasoning_effort)
    service = ToolService(ToolsSpec.model_validate(tools or TOOLS), SandboxSpec(isolation="weak"))
    model = FamilyGenerator(tokenizer, policy(family))
    try:
        generator = ToolGenerator(model, service, tokenizer, eos_ids, family.reasoning_effort)
        ((completion,),) = generator.generate([RowPrompt(prompt, example, 0)], SamplingParams(n=1, max_new_tokens=2000))
    finally:
        service.close()
    return tokenizer, prompt, completion, model


@pytest.mark.parametrize("family", FAMILIES, ids=family_id)
def test_three_turns_with_each_family_template(family: Family):
    tokenizer, prompt, completion, model = run_episode(family)
    assert completion.finish_reason == "stop" and completion.text == "10064"  # the answer alone: what graders see
    if family.reasoning_effort and family.name == "qwen3":  # its reasoning stays in the turns (the samples view)
        assert completion.turns[-1]["content"].startswith("<think>") and completion.turns[-1]["content"].endswith(
            "10064"
        )
    assert [m["role"] for m in completion.turns] == ["assistant", "tool", "assistant", "tool", "assistant"]
    first, second = completion.turns[0]["tool_calls"][0], completion.turns[2]["tool_calls"][0]
    assert (first["id"], second["id"]) == ("call01000", "call02000")
    assert first["function"]["arguments"] == '{"expression": "347*29"}'
    assert [completion.turns[i]["content"] for i in (1, 3)] == ["10063", "10064"]
    assert [completion.turns[i]["tool_call_id"] for i in (1, 3)] == ["call01000", "call02000"]

    # the episode: the model's three turns as sampled, and after each call exactly the template's tokens
    eos = family.special[0]
    turns = [
        family.call("347*29") + (family.call_end or eos),
        family.call("10063+1") + (family.call_end or eos),
        family.answer("10064") + (family.answer_end or eos),
    ]
    after = [family.after_result.format(result=r, id=i) for r, i in (("10063", "call01000"), ("10064", "call02000"))]
    text = tokenizer.decode(prompt + completion.token_ids, skip_special_tokens=False)
    assert (
        text
        == tokenizer.decode(prompt, skip_special_tokens=False) + turns[0] + after[0] + turns[1] + after[1] + turns[2]
    )
    assert model.contexts[1].endswith(after[0]) and model.contexts[2].endswith(after[1])

    # only the model's tokens carry loss and log-probs
    def count(piece: str) -> int:
        return len(tokenizer(piece, add_special_tokens=False)["input_ids"])

    spans = [(count(turns[0]), 1), (count(after[0]), 0), (count(turns[1]), 1), (count(after[1]), 0)]
    expected = [m for n, m in spans for _ in range(n)] + [1] * count(turns[2])
    assert completion.loss_mask == expected
    assert [lp != 0.0 for lp in completion.logprobs] == [bool(m) for m in expected]


@pytest.mark.parametrize("family", FAMILIES, ids=family_id)
def test_the_template_renders_the_episode_messages(family: Family):
    """The episode's messages are valid input for the family's template (ids, call shapes): the conversation
    renders whole, as an inference server would render it."""
    tokenizer, _, completion, _ = run_episode(family)
    messages = [
        {**m, "tool_calls": [template_arguments(c) for c in m["tool_calls"]]} if "tool_calls" in m else m
        for m in completion.turns
    ]
    text = chat_text(tokenizer, [*QUESTION.messages, *messages], QUESTION.tools, family.reasoning_effort, False)
    assert "10063" in text and "10064" in text


def test_qwen3_drops_the_empty_think_block_of_a_turn_once_a_tool_result_follows():
    """Why a plain prefix check is not enough: Qwen3 renders an empty think block into the last assistant
    turn only, so the rendering without the tool results is no prefix of the rendering with them."""
    (family,) = [f for f in FAMILIES if f.name == "qwen3" and not f.reasoning_effort]
    tokenizer = family.tokenizer()
    call = {
        "id": call_id(1, 0),
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "1"}},
    }
    before = [*QUESTION.messages, {"role": "assistant", "content": "", "tool_calls": [call]}]
    after = [*before, {"role": "tool", "tool_call_id": call["id"], "content": "1"}]
    head = chat_text(tokenizer, before, QUESTION.tools, None, add_generation_prompt=False)
    full = chat_text(tokenizer, after, QUESTION.tools, None, add_generation_prompt=True)
    assert "<think>\n\n</think>" in head and not full.startswith(head)
    assert continuation_text(head, full, "<|im_end|>") == family.after_result.format(result="1", id=call["id"])


def test_a_template_that_rewrites_earlier_turns_is_refused():
    head = "<u>q</u><a>one</a><u>r</u><a>two</a>"
    full = "<u>q</u><a>ONE</a><u>r</u><a>two</a><t>x</t><a>"
    with pytest.raises(ToolTemplateError, match="earlier turns"):
        continuation_text(head, full, "</a>")


def test_mistral_templates_raise_on_call_ids_that_are_not_nine_characters():
    """The fixtures keep the published check; the episodes' ids pass it (the three-turn tests)."""
    for name in ("mistral", "ministral"):
        (family,) = [f for f in FAMILIES if f.name == name]
        call = {"id": "call_1_0", "type": "function", "function": {"name": "calculator", "arguments": {"e": "1"}}}
        messages = [*QUESTION.messages, {"role": "assistant", "content": "", "tool_calls": [call]}]
        with pytest.raises(Exception, match="Tool call IDs should be alphanumeric strings with length 9"):
            chat_text(family.tokenizer(), messages, QUESTION.tools, None, add_generation_prompt=False)
    assert all(len(call_id(t, i)) == 9 and call_id(t, i).isalnum() for t in (1, 63) for i in (0, 999))


@pytest.mark.parametrize("family", FAMILIES, ids=family_id)
def test_each_family_shows_the_tools_in_the_prompt(family: Family):
    """Phi-4-mini's template never reads ``tools``: it gets them as JSON in the system message's "tools"."""
    tokenizer = family.tokenizer()
    prompt = render_prompt(tokenizer, QUESTION.messages, QUESTION.tools, family.reasoning_effort)
    assert "calculator" in tokenizer.decode(prompt, skip_special_tokens=False)


def test_each_template_gets_what_it_needs():
    """Found by rendering: DeepSeek's templates concatenate the arguments (a JSON string), gpt-oss's and
    Hermes-3's the descriptions (an empty one for a tool without), Phi-4-mini's read the tools from the system message;
    the others take the tools and calls as they are."""
    needs = {family_id(f): template_needs(f.tokenizer()) for f in FAMILIES}
    assert needs["deepseek_r1"] == needs["deepseek_v3_1"] == TemplateNeeds(string_arguments=True)
    assert needs["phi4_mini"] == TemplateNeeds(system_tools=True)
    assert needs["gpt_oss"] == TemplateNeeds(descriptions=True)  # the calculator tool here has no description
    for name in ("qwen2_5", "qwen3", "llama3_1", "llama3_2", "mistral", "ministral"):
        assert needs[name] == TemplateNeeds(), name
    hermes = Family("hermes3", "hermes3.jinja", ("<|im_end|>", "<|im_start|>"), ("<tool_call>", "</tool_call>"))
    tokenizer = hermes.tokenizer()
    assert template_needs(tokenizer) == TemplateNeeds(descriptions=True)
    bare = {
        "type": "function",
        "function": {k: v for k, v in CALCULATOR_TOOL["function"].items() if k != "description"},
    }
    with pytest.raises(Exception, match=r"has no attribute 'description'"):  # as the published template raises
        tokenizer.apply_chat_template(QUESTION.messages, tools=[bare], tokenize=False)
    text = tokenizer.decode(render_prompt(tokenizer, QUESTION.messages, [bare]), skip_special_tokens=False)
    assert '"name": "calculator", "description": "calculator - "' in text
    described = {"type": "function", "function": {**CALCULATOR_TOOL["function"], "description": "Evaluates"}}
    text = tokenizer.decode(render_prompt(tokenizer, QUESTION.messages, [described]), skip_special_tokens=False)
    assert '"description": "calculator - Evaluates"' in text  # a description is left as it is


def test_deepseek_gets_its_arguments_as_a_string():
    (family,) = [f for f in FAMILIES if f.name == "deepseek_r1"]
    tokenizer = family.tokenizer()
    call = {
        "id": call_id(1, 0),
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "1"}},
    }
    messages = [*QUESTION.messages, {"role": "assistant", "content": "", "tool_calls": [call]}]
    with pytest.raises(TypeError, match="can only concatenate str"):  # what a dict did, as measured
        tokenizer.apply_chat_template(messages, tools=QUESTION.tools, tokenize=False)
    text = chat_text(tokenizer, messages, QUESTION.tools, None, add_generation_prompt=False)
    assert '```json\n{"expression": "1"}\n```' in text
