"""A short supervised loop with the ``cross_entropy`` loss, against the official ``tinker`` SDK only:
the prompt's tokens weighted 0, the reference answer's (and its end token) 1.

    python examples/tinker_rl/sft.py --steps 30
"""

from __future__ import annotations

import argparse
import random

import tinker
from tinker import types
from train import Prompts, evaluate, load


def sft_datum(prompts: Prompts, row: dict) -> types.Datum:
    prompt = prompts.tokens(row)
    answer = prompts.tokenizer(row["reference_answer"], add_special_tokens=False)["input_ids"]
    tokens = prompt + answer + [prompts.tokenizer.eos_token_id]
    weights = [0.0] * (len(prompt) - 1) + [1.0] * (len(answer) + 1)  # position i predicts token i + 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-model", default="openrft-demo")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    train, validation = load("train.jsonl"), load("validation.jsonl")
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=args.base_model, rank=16, seed=0).result()
    prompts = Prompts(training.get_tokenizer())
    before = evaluate(training.save_weights_and_get_sampling_client().result(), prompts, validation, 6)
    rng = random.Random(0)
    for step in range(args.steps):
        batch = [sft_datum(prompts, row) for row in rng.sample(train, args.batch)]
        tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in batch)
        result = training.forward_backward(batch, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=args.lr)).result()
        print(f"step {step + 1}: loss per answer token {result.result().metrics['loss:sum'] / tokens:.3f}")
    after = evaluate(training.save_weights_and_get_sampling_client().result(), prompts, validation, 6)
    print(f"validation exact match: {before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
