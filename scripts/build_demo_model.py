"""Build the bundled demo model and the demo arithmetic dataset, deterministically.

The demo model is a small Qwen2-architecture causal LM with a character-level tokenizer and a
ChatML chat template. It is pre-trained with a short supervised pass on the arithmetic task so
that it starts partly right, which leaves room for reinforcement fine-tuning to improve it. Half of
the pre-training answers are written in a second style (``=42`` rather than ``42``) that the
demo's ``exact_match`` reward does not accept: reinforcement fine-tuning has to teach the model the
answer style the reward asks for, as well as sharpen its arithmetic.

    python scripts/build_demo_model.py            # writes src/openrft/assets/demo_model and
                                                  # examples/arithmetic/{train,validation}.jsonl
                                                  # (and vertex_{train,validation}.jsonl: Vertex format)

Rebuilding gives byte-identical files: one CPU thread, fixed seeds, deterministic algorithms.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2TokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from openrft.data.vertex_format import to_vertex_record

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "src" / "openrft" / "assets" / "demo_model"
DATA_DIR = ROOT / "examples" / "arithmetic"

CHARS = string.digits + string.ascii_letters + " \n+-*/=?.,:;!'\"()[]{}<>_#%&|@^~$\\`"
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SEED = 1234
# Stopped on the steep part of the learning curve: 52% of validation answers right in either style when
# sampled at temperature 1, 26% exactly right (the bare style); greedy 62.5% and 28% (`--calibrate`
# prints the curve every 100 steps).
DEFAULT_STEPS = 2400


def build_tokenizer() -> Qwen2TokenizerFast:
    """A Qwen2 byte-level BPE tokenizer with one token per character and no merges.

    Being a genuine Qwen2 tokenizer (the same pre-tokenizer and byte-level mapping), it loads the
    same way through ``AutoTokenizer`` in every transformers version.
    """
    byte_to_char = bytes_to_unicode()
    vocab = {byte_to_char[ord(c)]: i for i, c in enumerate(CHARS)}
    tokenizer = Qwen2TokenizerFast(
        vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 512
    return tokenizer


def make_problem(rng: random.Random) -> tuple[str, str]:
    """One arithmetic problem: addition or subtraction of numbers below 100."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    if rng.random() < 0.5:
        return f"What is {a}+{b}?", str(a + b)
    a, b = max(a, b), min(a, b)
    return f"What is {a}-{b}?", str(a - b)


def decorate_answers(rows: list[dict], rng: random.Random) -> list[dict]:
    """The pre-training target of each row: the bare answer, or the ``=answer`` style half the time."""
    return [
        {**row, "target": row["reference_answer"] if rng.random() < 0.5 else "=" + row["reference_answer"]}
        for row in rows
    ]


def make_dataset(rng: random.Random, count: int, prefix: str, seen: set[str]) -> list[dict]:
    rows = []
    while len(rows) < count:
        question, answer = make_problem(rng)
        if question in seen:
            continue
        seen.add(question)
        rows.append(
            {
                "id": f"{prefix}-{len(rows):05d}",
                "messages": [{"role": "user", "content": question}],
                "reference_answer": answer,
                "task": "addition" if "+" in question else "subtraction",
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def build_model(vocab_size: int, tokenizer: Qwen2TokenizerFast) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForCausalLM(config)


def sft_batch(tokenizer: Qwen2TokenizerFast, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and labels that score only the assistant answer (its target) and end token."""
    seqs, labels = [], []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(row["target"], add_special_tokens=False)["input_ids"]
        answer_ids = [*answer_ids, tokenizer.eos_token_id]
        seqs.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    lab = torch.full((len(seqs), width), -100)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(l)] = torch.tensor(l)
    return ids, lab


@torch.no_grad()
def sampled_accuracy(model, tokenizer, rows: list[dict], temperature: float = 1.0) -> tuple[float, float]:
    """Fractions of problems answered exactly and answered right in either style, one sample each."""
    model.eval()
    torch.manual_seed(0)
    correct = right = 0
    for start in range(0, len(rows), 100):
        chunk = rows[start : start + 100]
        prompts = [
            tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in chunk
        ]
        tokenizer.padding_side = "left"
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **enc,
            max_new_tokens=6,
            do_sample=temperature > 0,
            temperature=temperature or None,
            top_k=0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        correct += sum(t.strip() == r["reference_answer"] for t, r in zip(texts, chunk))
        right += sum(t.strip().removeprefix("=") == r["reference_answer"] for t, r in zip(texts, chunk))
    model.train()
    return correct / len(rows), right / len(rows)


def pretrain(
    model,
    tokenizer,
    rows: list[dict],
    steps: int,
    batch_size: int,
    report: list[dict] | None,
    snapshot_dir: Path | None = None,
) -> None:
    """A short supervised pass, stopped while the model is still partly right (see DEFAULT_STEPS)."""
    rng = random.Random(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    model.train()
    for step in range(1, steps + 1):
        ids, labels = sft_batch(tokenizer, rng.sample(rows, batch_size))
        attention_mask = (ids != tokenizer.pad_token_id) | (labels != -100)
        loss = model(input_ids=ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if report is not None and step % 100 == 0:
            sampled, sampled_any = sampled_accuracy(model, tokenizer, report, 1.0)
            greedy, greedy_any = sampled_accuracy(model, tokenizer, report, 0.0)
            print(
                f"step {step} loss {loss.item():.3f} exact: sampled {sampled:.3f} greedy {greedy:.3f}; "
                f"either style: sampled {sampled_any:.3f} greedy {greedy_any:.3f}",
                flush=True,
            )
            if snapshot_dir is not None:
                save(model, tokenizer, snapshot_dir / f"step-{step}")


def save(model, tokenizer, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="supervised pre-training steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--calibrate", action="store_true", help="print sampled accuracy every 100 steps")
    parser.add_argument("--snapshot-dir", type=Path, help="with --calibrate: save the model every 100 steps")
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)

    seen: set[str] = set()
    train = make_dataset(rng, 2000, "train", seen)
    validation = make_dataset(rng, 200, "val", seen)
    pretrain_rows = make_dataset(rng, 5000, "sft", seen)  # disjoint from both RFT splits
    pretrain_rows = decorate_answers(pretrain_rows, random.Random(SEED + 1))
    write_jsonl(args.data_dir / "train.jsonl", train)
    write_jsonl(args.data_dir / "validation.jsonl", validation)
    # The same examples in the Vertex dataset format, for examples/arithmetic/vertex_job.json.
    write_jsonl(args.data_dir / "vertex_train.jsonl", [to_vertex_record(r) for r in train])
    write_jsonl(args.data_dir / "vertex_validation.jsonl", [to_vertex_record(r) for r in validation])

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer)
    pretrain(
        model,
        tokenizer,
        pretrain_rows,
        args.steps,
        args.batch_size,
        validation if args.calibrate else None,
        args.snapshot_dir,
    )
    for label, temperature in (("sampled", 1.0), ("greedy", 0.0)):
        exact, either = sampled_accuracy(model, tokenizer, validation, temperature)
        print(f"validation {label} accuracy after pre-training: {exact:.3f} exact, {either:.3f} in either style")

    save(model, tokenizer, args.model_dir)
    print(f"wrote {args.model_dir} and {args.data_dir}")


if __name__ == "__main__":
    main()
