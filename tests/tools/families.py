"""Chat-template families for the tool-episode tests: the project's own templates (chat_templates/*.jinja,
each recording the published template whose behaviours it reproduces), a byte-level tokenizer carrying the
family's special tokens, and how a model of the family writes a call, an answer and the end of its turn.

No model or tokenizer is downloaded: the tokenizer is a Qwen2 byte-level BPE with one token per byte (every
text encodes) plus the family's special tokens, so the tokens around a tool result are the template's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers import Qwen2TokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams
from tests.tools.scripted import TURN_LOGP

TEMPLATES = Path(__file__).resolve().parent / "chat_templates"


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # file in chat_templates/
    special: tuple[str, ...]  # special tokens of the family's tokenizer (the first is EOS)
    added: tuple[str, ...] = ()  # added tokens that decode keeps (Qwen's <tool_call>, <think>)
    bos: str | None = None
    reasoning_effort: str | None = None
    answer_end: str = ""  # the end token of an answer when it is not EOS (harmony's <|return|>)
    call_end: str = ""  # the end token of a call turn when it is not EOS (harmony's <|call|>)
    after_result: str = ""  # the template's tokens after a call turn's end: {result}, {id} filled in

    def call(self, expression: str) -> str:
        """How the family's model writes a calculator call (its published output format)."""
        arguments = {"expression": expression}
        if self.name.startswith("qwen"):
            think = "<think>\nUse the calculator.\n</think>\n\n" if self.reasoning_effort else ""
            body = json.dumps({"name": "calculator", "arguments": arguments})
            return f"{think}<tool_call>\n{body}\n</tool_call>"
        if self.name == "llama3_1":
            return json.dumps({"name": "calculator", "parameters": arguments})
        if self.name == "llama3_2":
            return f"[calculator(expression={expression!r})]"
        if self.name == "mistral":
            return "[TOOL_CALLS] " + json.dumps([{"name": "calculator", "arguments": arguments}])
        if self.name == "ministral":
            return "[TOOL_CALLS]calculator[ARGS]" + json.dumps(arguments)
        if self.name == "gpt_oss":
            return (
                "<|channel|>analysis<|message|>Use the calculator.<|end|><|start|>assistant<|channel|>commentary "
                f"to=functions.calculator <|constrain|>json<|message|>{json.dumps(arguments)}"
            )
        if self.name == "deepseek_r1":
            return (
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculator\n```json\n"
                f"{json.dumps(arguments)}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            )
        if self.name == "deepseek_v3_1":
            return (
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>"
                f"{json.dumps(arguments)}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            )
        if self.name == "phi4_mini":
            return "functools[" + json.dumps({"name": "calculator", "arguments": arguments}) + "]"
        raise ValueError(self.name)

    def answer(self, text: str) -> str:
        if self.name == "gpt_oss":
            return f"<|channel|>final<|message|>{text}"
        if self.name.startswith("qwen3") and self.reasoning_effort:
            return f"<think>\nDone.\n</think>\n\n{text}"
        return text

    def tokenizer(self):
        return family_tokenizer(self)


MISTRAL_SPECIAL = ("</s>", "<s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]")
MISTRAL_SPECIAL += ("[TOOL_RESULTS]", "[/TOOL_RESULTS]")
QWEN_RESULT = "\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
LLAMA_RESULT = (
    "<|start_header_id|>ipython<|end_header_id|>\n\n{result}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
)

DEEPSEEK_SPECIAL = ("<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")
DEEPSEEK_SPECIAL += ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>")
DEEPSEEK_SPECIAL += ("<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>")
DEEPSEEK_SPECIAL += ("<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")

FAMILIES = [
    Family(
        "qwen2_5",
        "qwen2_5.jinja",
        ("<|im_end|>", "<|im_start|>", "<|endoftext|>"),
        ("<tool_call>", "</tool_call>"),
        after_result=QWEN_RESULT,
    ),
    Family(
        "qwen3",
        "qwen3.jinja",
        ("<|im_end|>", "<|im_start|>", "<|endoftext|>"),
        ("<tool_call>", "</tool_call>", "<think>", "</think>"),
        after_result=QWEN_RESULT + "<think>\n\n</think>\n\n",  # thinking off: an empty think block
    ),
    Family(
        "qwen3",
        "qwen3.jinja",
        ("<|im_end|>", "<|im_start|>", "<|endoftext|>"),
        ("<tool_call>", "</tool_call>", "<think>", "</think>"),
        reasoning_effort="medium",
        after_result=QWEN_RESULT,
    ),
    Family(
        "llama3_1",
        "llama3_1.jinja",
        ("<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"),
        bos="<|begin_of_text|>",
        after_result=LLAMA_RESULT,
    ),
    Family(
        "llama3_2",
        "llama3_2.jinja",
        ("<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"),
        bos="<|begin_of_text|>",
        after_result=LLAMA_RESULT,
    ),
    Family(
        "mistral",
        "mistral.jinja",
        MISTRAL_SPECIAL,
        bos="<s>",
        after_result='[TOOL_RESULTS] {{"content": {result}, "call_id": "{id}"}}[/TOOL_RESULTS]',
    ),
    Family(
        "ministral",
        "ministral.jinja",
        (*MISTRAL_SPECIAL, "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[ARGS]", "[CALL_ID]", "[TOOL_CONTENT]"),
        bos="<s>",
        after_result="[TOOL_RESULTS]{id}[TOOL_CONTENT]{result}[/TOOL_RESULTS]",
    ),
    Family(
        "gpt_oss",
        "gpt_oss.jinja",
        ("<|return|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"),
        reasoning_effort="low",
        answer_end="<|return|>",
        call_end="<|call|>",
        after_result='<|start|>functions.calculator to=assistant<|channel|>commentary<|message|>"{result}"<|end|>'
        "<|start|>assistant",
    ),
    Family(
        "deepseek_r1",
        "deepseek_r1.jinja",
        DEEPSEEK_SPECIAL,
        bos="<｜begin▁of▁sentence｜>",
        after_result="<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{result}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
    ),
    Family(
        "deepseek_v3_1",
        "deepseek_v3_1.jinja",
        DEEPSEEK_SPECIAL,
        bos="<｜begin▁of▁sentence｜>",
        after_result="<｜tool▁output▁begin｜>{result}<｜tool▁output▁end｜>",
    ),
    Family(
        "phi4_mini",
        "phi4_mini.jinja",
        ("<|endoftext|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|/tool|>"),
        answer_end="<|end|>",
        call_end="<|end|>",
        after_result="<|tool|>{result}<|end|><|assistant|>",
    ),
]


def family_id(family: Family) -> str:
    return family.name + (
        f"-thinking-{family.reasoning_effort}" if family.name == "qwen3" and family.reasoning_effort else ""
    )


def family_tokenizer(family: Family):
    """A byte-level tokenizer (one token per byte, no merges) with the family's special tokens and template."""
    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    tokenizer = Qwen2TokenizerFast(
        vocab=vocab, merges=[], unk_token=None, bos_token=family.bos, eos_token=family.special[0], pad_token=None
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.special[1:])})
    if family.added:
        tokenizer.add_tokens(list(family.added))
    tokenizer.chat_template = (TEMPLATES / family.template).read_text()
    return tokenizer


class FamilyGenerator(PolicyVersioned):
    """A Generator for the family tests: ``policy(context)`` gives the turn's text and its end token (the
    family's: EOS, or harmony's <|call|> / <|return|>); every token's log-prob is TURN_LOGP."""

    def __init__(self, tokenizer, policy: Callable[[str], tuple[str, str]]):
        self.tokenizer, self.policy = tokenizer, policy
        self.contexts: list[str] = []  # every context the model was given, as text
        self.rng = None

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None):
        groups = []
        for prompt in prompts:
            context = self.tokenizer.decode(prompt, skip_special_tokens=False)
            self.contexts.append(context)
            text, end = self.policy(context)
            ids = self.tokenizer(text + end, add_special_tokens=False)["input_ids"]
            shown = self.tokenizer.decode(ids[:-1], skip_special_tokens=True)
            completion = Completion(list(prompt), ids, [TURN_LOGP] * len(ids), shown, "stop", self.policy_version)
            groups.append([completion] + [Completion(**completion.__dict__) for _ in range(params.n - 1)])
        return groups

    def load_adapter(self, weights, version: int) -> None:
        self.set_policy_version(version)
