"""A scripted policy for episode tests: decides each turn's text from the conversation so far (a stand-in
for the model's choices; the tokenizer, the chat template and the tools are the real ones)."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

from openrft.data.records import Example
from openrft.rollout.prompts import render_prompt
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
TURN_LOGP = -0.5


def tool_tokenizer():
    """The calculator example's tokenizer and tool chat template, as scripts/build_tool_model.py builds them."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("build_tool_model", ROOT / "scripts" / "build_tool_model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return module.build_tool_tokenizer()


def call(expression: str, name: str = "calculator") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def calculator_user(context: str) -> str:
    """Calls the calculator with the question's expression, then answers with the tool's result."""
    results = re.findall(r"<tool_response>(.*?)</tool_response>", context)
    if results:
        return results[-1]
    return call(re.findall(r"What is (\S+)\?", context)[-1])


class ScriptedGenerator(PolicyVersioned):
    """A Generator whose turn texts come from ``policy(context_text)``; each token's log-prob is TURN_LOGP."""

    def __init__(self, tokenizer, policy: Callable[[str], str]):
        self.tokenizer, self.policy = tokenizer, policy
        self.calls: list[int] = []  # prompts per generate call
        self.rng = None

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None):
        self.calls.append(len(prompts))
        eos = self.tokenizer.eos_token_id
        groups = []
        for prompt in prompts:
            text = self.policy(self.tokenizer.decode(prompt, skip_special_tokens=False))
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], eos]
            finish = "stop"
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
            shown = ids[:-1] if finish == "stop" else ids
            completion = Completion(
                list(prompt),
                ids,
                [TURN_LOGP] * len(ids),
                self.tokenizer.decode(shown, skip_special_tokens=True),
                finish,
                self.policy_version,
            )
            groups.append([completion] + [Completion(**{**completion.__dict__}) for _ in range(params.n - 1)])
        return groups

    def load_adapter(self, weights, version: int) -> None:
        self.set_policy_version(version)


CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def question(a: int, b: int, id: str = "q") -> Example:
    return Example(
        id=id,
        messages=[{"role": "user", "content": f"What is {a}*{b}?"}],
        fields={"reference_answer": str(a * b)},
        tools=[CALCULATOR_TOOL],
    )


def prompts_of(tokenizer, examples: list[Example]) -> list[list[int]]:
    return [render_prompt(tokenizer, e.messages, e.tools) for e in examples]
