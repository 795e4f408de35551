"""Build the guessing-game example's model and data (examples/guessing), deterministically.

A sibling of the demo model (scripts/build_demo_model.py: the same Qwen2 architecture and character-level
tokenizer) with a chat template in the shape of Llama 3.2's pythonic tool calls: the model writes
``[guess(n=8)]``, the environment's answer comes back as a ``tool`` message. It is pre-trained on games of
examples/guessing/game.py (a number from 1 to 15, 4 guesses) played by a careless player: a guess is the middle
of the range still possible only a quarter of the time (``MIDDLE``); otherwise it is the lowest number of that
range (counting up). Halving always wins in 4 guesses, counting up only when the number is at most 4 above
where it starts; the pre-trained model wins about a third of its games. Reinforcement fine-tuning has to find
out that halving pays.

    python scripts/build_guess_model.py     # writes examples/guessing/model and {train,validation}.jsonl

Rebuilding gives byte-identical files: one CPU thread, fixed seeds, deterministic algorithms.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_demo_model import build_model, build_tokenizer, save, write_jsonl
from openrft.rollout.prompts import render_prompt
from tool_sft import Batch, EpisodeTokens, chat_template, padded, pretrain

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_DIR = ROOT / "examples" / "guessing"
SEED = 2468
TURNS = 4  # guesses per game: the game's own limit (examples/guessing/game.py)
MIDDLE = 0.25  # how often the pre-training player halves the range; otherwise it guesses the range's lowest
DEFAULT_STEPS = 800
PYTHONIC_TEMPLATE = chat_template(
    "{%- if message.tool_calls %}"
    "{{- '[' }}"
    "{%- for call in message.tool_calls %}"
    "{{- call.function.name + '(' }}"
    "{%- for key, value in call.function.arguments.items() %}"
    "{{- key + '=' + (value | tojson) }}{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}"
    "{{- ')' }}{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}"
    "{{- ']' }}"
    "{%- endif %}"
)
GUESS = {
    "type": "function",
    "function": {
        "name": "guess",
        "description": "Guess the hidden number; the answer is higher LO-HI, lower LO-HI or correct",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    },
}
PROMPT = "Guess my number: 1-15."


def game_class():
    """examples/guessing/game.py's NumberGame: the pre-training games are played by the environment itself."""
    spec = importlib.util.spec_from_file_location("guessing_game", EXAMPLE_DIR / "game.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.NumberGame


def build_guess_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = PYTHONIC_TEMPLATE
    return tokenizer


def make_rows(rng: random.Random, count: int, prefix: str) -> list[dict]:
    """Rows that all show the same prompt; the hidden number is the row's ``reference_answer``."""
    return [
        {
            "id": f"{prefix}-{i:05d}",
            "messages": [{"role": "user", "content": PROMPT}],
            "tools": [GUESS],
            "reference_answer": str(rng.randint(1, 15)),
        }
        for i in range(count)
    ]


def balanced_rows(per_number: int, prefix: str) -> list[dict]:
    """Each number from 1 to 15 hidden ``per_number`` times (validation: every number weighs the same)."""
    rows = make_rows(random.Random(0), 15 * per_number, prefix)
    for i, row in enumerate(rows):
        row["reference_answer"] = str(i % 15 + 1)
    return rows


def player_guess(rng: random.Random, lo: int, hi: int) -> int:
    return (lo + hi) // 2 if rng.random() < MIDDLE else lo


def sft_sequence(tokenizer, game, row: dict, rng: random.Random) -> tuple[list[int], list[int]]:
    """One game of the careless player, as token ids and labels on the player's own turns."""
    messages = list(row["messages"])
    episode = EpisodeTokens(tokenizer, render_prompt(tokenizer, messages, row["tools"]))
    game.reset(row)
    for turn in range(1, TURNS + 1):
        n = player_guess(rng, game.lo, game.hi)
        episode.model_turn(f"[guess(n={n})]")
        call = {"id": f"call{turn:02d}000", "type": "function", "function": {"name": "guess", "arguments": {"n": n}}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        answer = game.step("guess", {"n": n})
        if game.found or turn == TURNS:
            break
        before = list(messages)
        messages.append({"role": "tool", "tool_call_id": call["id"], "name": "guess", "content": answer})
        episode.tool_turn(before, messages, row["tools"])
    return episode.ids, episode.labels


def batch(tokenizer, game, rows: list[dict], rng: random.Random) -> Batch:
    return padded(tokenizer, [sft_sequence(tokenizer, game, row, rng) for row in rows])


@torch.no_grad()
def calibrate(model, tokenizer, rows: list[dict], seed: int = 0) -> tuple[float, float]:
    """(share of games won, share of guesses at the middle of the range) when the model plays ``rows`` at
    temperature 1 through OpenRFT's own tool episodes, as the recipe's validation does."""
    from openrft.data.records import Example
    from openrft.rollout.local import TransformersGenerator
    from openrft.rollout.types import SamplingParams
    from openrft.spec.rewards import SandboxSpec
    from openrft.spec.tools import ToolsSpec
    from openrft.tools.episodes import ToolGenerator, ToolService, row_prompts

    model.eval()
    tools = ToolsSpec.model_validate(
        {
            "max_turns": TURNS + 1,  # the game ends itself after its 4th guess
            "schedule": "lockstep",
            "environment": {"module": str(EXAMPLE_DIR / "game.py"), "class_name": "NumberGame"},
        }
    )
    service = ToolService(tools, SandboxSpec(isolation="weak"))
    eos = [tokenizer.eos_token_id]
    try:
        inner = TransformersGenerator(model, tokenizer, eos, tokenizer.pad_token_id, seed=seed)
        episodes = ToolGenerator(inner, service, tokenizer, eos)
        examples = [
            Example(r["id"], r["messages"], {"reference_answer": r["reference_answer"]}, r["tools"]) for r in rows
        ]
        prompts = row_prompts(examples, [render_prompt(tokenizer, e.messages, e.tools) for e in examples])
        params = SamplingParams(n=1, temperature=1.0, top_k=0, max_new_tokens=192, max_length=256)
        completions = [c for group in episodes.generate(prompts, params, seed) for c in group]
    finally:
        service.close()
        model.train()
    won = sum(c.metadata.get("environment_reward", 0.0) for c in completions)
    middle = guesses = 0
    for c in completions:
        lo, hi = 1, 15
        for n in c.metadata.get("environment_state", {}).get("guesses", []):
            middle += n == (lo + hi) // 2
            guesses += 1
            secret = int(c.metadata["environment_state"]["secret"])
            lo, hi = (max(lo, n + 1), hi) if n < secret else (lo, min(hi, n - 1))
    return won / len(completions), middle / max(guesses, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--calibrate", action="store_true", help="play the validation games every 100 steps")
    parser.add_argument("--no-games", action="store_true", help="do not play the validation games at the end")
    parser.add_argument("--out", type=Path, default=EXAMPLE_DIR)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    train = make_rows(rng, 1000, "train")
    validation = balanced_rows(8, "val")
    write_jsonl(args.out / "train.jsonl", train)
    write_jsonl(args.out / "validation.jsonl", validation)

    tokenizer = build_guess_tokenizer()
    model = build_model(len(tokenizer), tokenizer)
    game = game_class()({})
    games = random.Random(SEED + 1)

    def show(step: int, loss: float) -> None:
        won, middle = calibrate(model, tokenizer, validation)
        print(f"step {step} loss {loss:.3f} won {won:.3f} middle guesses {middle:.3f}", flush=True)

    def next_batch() -> Batch:
        rows = make_rows(games, args.batch_size, "sft")
        return batch(tokenizer, game, rows, games)

    pretrain(model, args.steps, next_batch, show if args.calibrate else None, decay=True)
    if not args.no_games:
        won, middle = calibrate(model, tokenizer, validation)
        print(f"after pre-training: won {won:.3f} of the validation games, middle guesses {middle:.3f}")
    save(model, tokenizer, args.out / "model")
    print(f"wrote {args.out / 'model'} and the datasets")


if __name__ == "__main__":
    main()
