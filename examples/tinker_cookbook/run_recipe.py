"""Runs tinker-cookbook 0.6.1's ``recipes/sl_loop.py`` or ``recipes/rl_loop.py`` unchanged against ``openrft
serve`` (docs/tinker.md, "The cookbook against OpenRFT"), with only the substitutions a machine without the
Hub needs: the tokenizer from the demo model's directory, the cookbook's generic ``role_colon`` renderer (it
recommends none for ``openrft-demo``), and the demo's arithmetic problems in place of no_robots (``sl``: the
reference answer as the assistant's turn) or gsm8k (``rl``: the answer after ``####``).

    openrft serve --workers 0 &
    export TINKER_API_KEY=tml-local
    python examples/tinker_cookbook/run_recipe.py sl --log-path /tmp/sl-loop
    python examples/tinker_cookbook/run_recipe.py rl --log-path /tmp/rl-loop [--loss-fn gspo]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import datasets
from transformers import AutoTokenizer

from openrft.service.tinker import checks
from openrft.service.tinker.settings import TinkerSettings

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ROOT / "examples" / "arithmetic" / "train.jsonl"


def local_dataset(name: str, *args, **kwargs) -> datasets.DatasetDict:
    rows = [json.loads(line) for line in PROBLEMS.read_text().splitlines() if line.strip()]
    if name == "HuggingFaceH4/no_robots":
        data = [{"messages": [*r["messages"], {"role": "assistant", "content": r["reference_answer"]}]} for r in rows]
    elif name == "openai/gsm8k":
        data = [{"question": r["messages"][0]["content"], "answer": f"#### {r['reference_answer']}"} for r in rows]
    else:
        raise ValueError(f"dataset {name!r}: this runner substitutes only no_robots and gsm8k")
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(data)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", choices=["sl", "rl"])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--log-path", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--loss-fn", help="rl only: importance_sampling, cispo, gspo (default: stable_reinforce)")
    args = parser.parse_args()
    common = {"base_url": args.base_url, "log_path": args.log_path, "model_name": "openrft-demo", "lora_rank": 8}
    common |= {"save_every": 2, "max_steps": args.steps}
    if args.recipe == "sl":
        from tinker_cookbook.recipes import sl_loop as recipe

        config = recipe.Config(**common, batch_size=8, max_length=256)
    else:
        from tinker_cookbook.recipes import rl_loop as recipe

        extra = {"loss_fn": args.loss_fn} if args.loss_fn else {}
        config = recipe.Config(**common, batch_size=4, group_size=4, max_tokens=16, **extra)
    directory = checks.published(TinkerSettings())["openrft-demo"]
    recipe.get_tokenizer = lambda name: AutoTokenizer.from_pretrained(directory)
    recipe.model_info.get_recommended_renderer_name = lambda name: "role_colon"
    recipe.datasets.load_dataset = local_dataset
    recipe.main(config)


if __name__ == "__main__":
    main()
