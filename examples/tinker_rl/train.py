"""A Tinker-style RL loop on the arithmetic data, written against the official ``tinker`` SDK only.

Each step samples ``group_size`` answers to each of ``groups`` prompts from the current weights, scores
them by exact match, takes each answer's advantage as its reward minus its group's mean, and trains on
them with the ``importance_sampling`` loss (the sampler's log-probs as the datum's ``logprobs``). The
validation reward is one sample at temperature 1 per validation problem, every ``eval_every`` steps.

    openrft serve --workers 0 &
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-$(openrft keys create) \
        python examples/tinker_rl/train.py --out runs/tinker_rl/metrics.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import tinker
from tinker import types

DATA = Path(__file__).resolve().parent.parent / "arithmetic"


def load(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def reward(text: str, reference: str) -> float:
    """Exact match after trimming and collapsing whitespace (the demo's ``exact_match``)."""
    return float(" ".join(text.split()) == " ".join(reference.split()))


class Prompts:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def tokens(self, row: dict) -> list[int]:
        text = self.tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


def evaluate(sampler, prompts: Prompts, rows: list[dict], max_tokens: int) -> float:
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)  # unseeded: the server batches them
    futures = [sampler.sample(types.ModelInput.from_ints(prompts.tokens(r)), 1, params) for r in rows]
    scores = [
        reward(prompts.text(f.result().sequences[0].tokens), r["reference_answer"]) for f, r in zip(futures, rows)
    ]
    return sum(scores) / len(scores)


def rl_data(prompt: list[int], sequences, rewards: list[float]) -> list[types.Datum]:
    """One datum per answer: the prompt and answer, the answer's tokens weighted by its advantage."""
    mean = sum(rewards) / len(rewards)
    data = []
    for seq, r in zip(sequences, rewards):
        if r == mean:
            continue  # no advantage, no gradient
        tokens = prompt + list(seq.tokens)
        n = len(tokens) - 1
        prompt_part = len(prompt) - 1
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": [0.0] * prompt_part + list(seq.logprobs),
                    "advantages": [0.0] * prompt_part + [r - mean] * (n - prompt_part),
                },
            )
        )
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-model", default="openrft-demo")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--groups", type=int, default=32, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="answers sampled per prompt")
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/tinker_rl/metrics.jsonl"))
    args = parser.parse_args()

    train, validation = load("train.jsonl"), load("validation.jsonl")
    rng = random.Random(args.seed)
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=args.base_model, rank=args.rank, seed=args.seed).result()
    prompts = Prompts(training.get_tokenizer())
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95)
    sample_params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    order: list[dict] = []
    train_seconds = 0.0
    with args.out.open("w") as log:
        for step in range(args.steps + 1):
            started = time.perf_counter()
            sampler = training.save_weights_and_get_sampling_client().result()
            publish_seconds = time.perf_counter() - started
            if step % args.eval_every == 0 or step == args.steps:
                row = {"step": step, "val_reward": evaluate(sampler, prompts, validation, args.max_tokens)}
                row["train_seconds"] = round(train_seconds, 2)
                print(json.dumps(row), flush=True)
                log.write(json.dumps(row) + "\n")
            if step == args.steps:
                break
            started = time.perf_counter()
            if len(order) < args.groups:
                order += rng.sample(train, len(train))
            batch, order = order[: args.groups], order[args.groups :]
            tokens = [prompts.tokens(r) for r in batch]
            futures = [sampler.sample(types.ModelInput.from_ints(t), args.group_size, sample_params) for t in tokens]
            data, rewards = [], []
            for prompt, r, future in zip(tokens, batch, futures):
                sequences = future.result().sequences
                scores = [reward(prompts.text(s.tokens), r["reference_answer"]) for s in sequences]
                rewards += scores
                data += rl_data(prompt, sequences, scores)
            if data:
                step_future = training.forward_backward(data, "importance_sampling")
                training.optim_step(adam).result()
                step_future.result()
            seconds = publish_seconds + time.perf_counter() - started
            train_seconds += seconds
            row = {"step": step + 1, "reward": sum(rewards) / len(rewards), "step_seconds": round(seconds, 4)}
            log.write(json.dumps(row) + "\n")
            log.flush()
    print(f"{args.steps} steps in {train_seconds:.1f} s of training ({train_seconds / args.steps:.3f} s/step)")


if __name__ == "__main__":
    main()
