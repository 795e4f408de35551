"""Build the calculator example's model and data (examples/calculator), deterministically.

A sibling of the demo model (scripts/build_demo_model.py: the same Qwen2 architecture and character-level
tokenizer) with four tool tokens and a Hermes-style chat template that renders the row's tools and tool
messages. It is pre-trained on multiplications it cannot do in its head (3-digit by 2-digit numbers) in two
styles: most answers are written directly (and are mostly wrong), the rest call the ``calculator`` tool,
read its result and copy it. Reinforcement fine-tuning then has to find out that the calculator pays.

    python scripts/build_tool_model.py      # writes examples/calculator/model and {train,validation}.jsonl

Rebuilding gives byte-identical files: one CPU thread, fixed seeds, deterministic algorithms.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_demo_model import build_model, build_tokenizer, save, write_jsonl
from openrft.rollout.prompts import render_prompt
from tool_sft import Batch, EpisodeTokens, chat_template, padded
from tool_sft import pretrain as sft_pretrain

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_DIR = ROOT / "examples" / "calculator"
SEED = 4321
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
TOOL_TEMPLATE = chat_template(
    "{%- for call in message.tool_calls or [] %}"
    "{{- '<tool_call>' + ({'name': call.function.name, 'arguments': call.function.arguments} | tojson)"
    " + '</tool_call>' }}"
    "{%- endfor %}",
    "{{- '<|im_start|>user\\n<tool_response>' + message.content + '</tool_response><|im_end|>\\n' }}",
)
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression: numbers, + - * / and parentheses",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
# Pre-training episodes that call the calculator (the skill of calling it and copying its result) ...
TOOL_SHARE = 0.6
# ... and how often the pre-trained model decides to call it first: the first token of a calling episode is
# trained on only so often that p(<tool_call> first) is about TOOL_DECISION.
TOOL_DECISION = 0.25
DECISION_LABELLED = TOOL_DECISION * (1 - TOOL_SHARE) / (TOOL_SHARE * (1 - TOOL_DECISION))
DEFAULT_STEPS = 1000


def build_tool_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(TOOL_TOKENS)  # one token each, kept by decode (not special), as in Qwen's tokenizers
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def make_rows(rng: random.Random, count: int, prefix: str, seen: set[str]) -> list[dict]:
    rows = []
    while len(rows) < count:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        question = f"What is {a}*{b}?"
        if question in seen:
            continue
        seen.add(question)
        rows.append(
            {
                "id": f"{prefix}-{len(rows):05d}",
                "messages": [{"role": "user", "content": question}],
                "tools": [CALCULATOR],
                "reference_answer": str(a * b),
                "expression": f"{a}*{b}",
            }
        )
    return rows


def call_text(expression: str) -> str:
    return "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "</tool_call>"


def sft_sequence(tokenizer, row: dict, use_tool: bool, decision: bool = True) -> tuple[list[int], list[int]]:
    """Token ids of one episode and its labels (-100 where the model did not write: prompt, tool result;
    and on the first answer token unless ``decision``)."""
    prompt = render_prompt(tokenizer, row["messages"], row["tools"])
    episode = EpisodeTokens(tokenizer, prompt)
    if use_tool:
        episode.model_turn(call_text(row["expression"]))
        call = {"id": "call_1_0", "type": "function"}
        call["function"] = {"name": "calculator", "arguments": json.dumps({"expression": row["expression"]})}
        before = [*row["messages"], {"role": "assistant", "content": "", "tool_calls": [call]}]
        after = [*before, {"role": "tool", "tool_call_id": "call_1_0", "content": row["reference_answer"]}]
        episode.tool_turn(before, after, row["tools"])
    episode.model_turn(row["reference_answer"])
    if not decision:
        episode.labels[len(prompt)] = -100
    return episode.ids, episode.labels


def batch(tokenizer, rows: list[dict], rng: random.Random) -> Batch:
    seqs = []
    for row in rows:
        use_tool = rng.random() < TOOL_SHARE
        decision = not use_tool or rng.random() < DECISION_LABELLED
        seqs.append(sft_sequence(tokenizer, row, use_tool, decision))
    return padded(tokenizer, seqs)


@torch.no_grad()
def calibrate(model, tokenizer, rows: list[dict]) -> tuple[float, float, float]:
    """(probability of calling the tool first, accuracy of the copied answer after a right call, direct
    accuracy), from the model's distributions: teacher-forced, no sampling."""
    model.eval()
    tool_token = tokenizer.convert_tokens_to_ids("<tool_call>")
    p_tool = copied = direct = 0.0
    for row in rows:
        prompt = render_prompt(tokenizer, row["messages"], row["tools"])
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        p_tool += torch.softmax(logits, -1)[tool_token].item()
        for use_tool in (True, False):
            ids, _ = sft_sequence(tokenizer, row, use_tool)
            answer = len(tokenizer(row["reference_answer"], add_special_tokens=False)["input_ids"]) + 1
            out = model(input_ids=torch.tensor([ids])).logits[0]
            predicted = out[len(ids) - answer - 1 : len(ids) - 1].argmax(-1).tolist()
            right = float(predicted == ids[len(ids) - answer :])
            if use_tool:
                copied += right
            else:
                direct += right
    model.train()
    return p_tool / len(rows), copied / len(rows), direct / len(rows)


def pretrain(model, tokenizer, rows: list[dict], steps: int, batch_size: int, report: list[dict] | None) -> None:
    rng = random.Random(SEED)

    def show(step: int, loss: float) -> None:
        p_tool, copied, direct = calibrate(model, tokenizer, report)
        print(f"step {step} loss {loss:.3f} p(tool) {p_tool:.3f} copied {copied:.3f} direct {direct:.3f}", flush=True)

    sft_pretrain(model, steps, lambda: batch(tokenizer, rng.sample(rows, batch_size), rng), show if report else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--calibrate", action="store_true", help="print the tool rate and accuracies every 100 steps")
    parser.add_argument("--out", type=Path, default=EXAMPLE_DIR)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    seen: set[str] = set()
    train = make_rows(rng, 1000, "train", seen)
    validation = make_rows(rng, 64, "val", seen)
    pretrain_rows = make_rows(rng, 8000, "sft", seen)  # disjoint from both RFT splits
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "validation.jsonl", validation)

    tokenizer = build_tool_tokenizer()
    model = build_model(len(tokenizer), tokenizer)
    pretrain(model, tokenizer, pretrain_rows, args.steps, args.batch_size, validation if args.calibrate else None)
    p_tool, copied, direct = calibrate(model, tokenizer, validation)
    print(f"after pre-training: p(tool) {p_tool:.3f}, copied after a call {copied:.3f}, direct {direct:.3f}")
    save(model, tokenizer, args.out / "model")
    print(f"wrote {args.out / 'model'} and the datasets")


if __name__ == "__main__":
    main()
