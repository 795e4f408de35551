"""The guessing-game example: its environment, its model and data, and the script that builds them."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from openrft.engine import RFTJob
from openrft.engine.samples import read_samples
from openrft.rollout.prompts import render_prompt
from openrft.rollout.tool_calls import parse_tool_calls
from openrft.spec.dialects import load_job
from openrft.tools.continuation import continuation_ids
from openrft.tools.runners import Step
from tests.tools.builders import build_twice, digest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_guess_model.py"
EXAMPLE = ROOT / "examples" / "guessing"


def game(secret: int):
    spec = importlib.util.spec_from_file_location("guessing_game_test", EXAMPLE / "game.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    played = module.NumberGame({})
    played.reset({"id": "val-00000", "reference_answer": str(secret)})
    return played


def test_the_game_narrows_the_range_and_ends_on_the_number():
    played = game(11)
    assert played.step("guess", {"n": 8}) == "higher 9-15"
    assert played.step("guess", {"n": 13}) == "lower 9-12"
    assert played.reward() == 0.0
    found = played.step("guess", {"n": 11})
    assert isinstance(found, Step) and found.done and found.content == "correct"
    assert played.reward() == 1.0
    assert played.state() == {"secret": 11, "guesses": [8, 13, 11], "found": True}
    lost = game(15)
    assert [lost.step("guess", {"n": n}) for n in (1, 2, 3)] == ["higher 2-15", "higher 3-15", "higher 4-15"]
    last = lost.step("guess", {"n": 4})  # the fourth wrong guess ends the game
    assert isinstance(last, Step) and last.done and last.content == "higher 5-15; no guesses left"
    assert lost.reward() == 0.0
    with pytest.raises(ValueError, match="whole number"):
        game(3).step("guess", {"n": "3"})
    with pytest.raises(ValueError, match="no tool"):
        game(3).step("answer", {"n": 3})


def test_the_rows_hide_the_number_behind_one_prompt():
    rows = [json.loads(line) for line in (EXAMPLE / "validation.jsonl").read_text().splitlines()]
    assert len({json.dumps(r["messages"]) for r in rows}) == 1
    assert Counter(r["reference_answer"] for r in rows) == Counter({str(n): 8 for n in range(1, 16)})
    spec = load_job(EXAMPLE / "recipe.yaml")
    assert spec.tools.environment.module == str(EXAMPLE / "game.py")
    assert spec.tools.max_turns == 5 and spec.tools.schedule == "lockstep"


def test_the_guessing_model_is_small_and_its_template_writes_pythonic_calls():
    model = AutoModelForCausalLM.from_pretrained(EXAMPLE / "model")
    tokenizer = AutoTokenizer.from_pretrained(EXAMPLE / "model")
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert sum(f.stat().st_size for f in (EXAMPLE / "model").iterdir()) < 5 * 2**20
    row = json.loads((EXAMPLE / "train.jsonl").read_text().splitlines()[0])
    assert tokenizer.decode(render_prompt(tokenizer, row["messages"], row["tools"])) == (
        "<|im_start|>system\nTools: guess(n)<|im_end|>\n"
        "<|im_start|>user\nGuess my number: 1-15.<|im_end|>\n<|im_start|>assistant\n"
    )
    parsed = parse_tool_calls("[guess(n=8)]", {"guess"})
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.calls] == [
        ("guess", {"n": 8})
    ]
    call = {"id": "call01000", "type": "function", "function": {"name": "guess", "arguments": {"n": 8}}}
    before = [*row["messages"], {"role": "assistant", "content": "", "tool_calls": [call]}]
    after = [*before, {"role": "tool", "tool_call_id": "call01000", "name": "guess", "content": "higher 9-15"}]
    tail = continuation_ids(tokenizer, before, after, row["tools"], None, tokenizer.eos_token_id)
    assert tokenizer.decode(tail) == "\n<|im_start|>tool\nhigher 9-15<|im_end|>\n<|im_start|>assistant\n"


def test_rebuilding_is_byte_identical_and_writes_the_committed_data(tmp_path):
    """The builder at 2 steps of 4 games, no games played at the end: what makes it byte-identical, cheaply."""
    a, b = tmp_path / "a", tmp_path / "b"
    build_twice(SCRIPT, ["--steps", "2", "--batch-size", "4", "--no-games"], a, b)
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja", "config.json"):
        assert digest(a / "model" / name) == digest(b / "model" / name), name
    for name in ("train.jsonl", "validation.jsonl"):
        assert digest(a / name) == digest(EXAMPLE / name), name


@pytest.mark.slow
def test_the_recipe_trains_on_games_the_environment_scores(tmp_path):
    """The example's recipe, small (4 prompts x 4 games, one step): every game is scored by the environment's
    reward (1 or 0), games end on the number (the environment's Step(done=True)) or after 4 guesses."""
    recipe = yaml.safe_load((EXAMPLE / "recipe.yaml").read_text())
    for key in ("model_name_or_path", "data_s3_path", "validation_data_s3_path"):
        recipe["run"][key] = str(EXAMPLE / recipe["run"][key])
    del recipe["run"]["output_s3_path"]
    config = recipe["training_config"]
    config["global_batch_size"] = 16
    config["rollout"]["advantage_strategy"]["number_generation"] = 4
    config["trainer"].update(max_steps=1, save_steps=1, test_steps=100)
    recipe["openrft"].update(eval_max_examples=4, threads=1, tensorboard=False)
    recipe["openrft"]["tools"]["environment"]["module"] = str(EXAMPLE / "game.py")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    summary = RFTJob(load_job(path), tmp_path / "run", show_progress=False).run()
    assert summary["status"] == "succeeded"
    step = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["reward/scored"] == 16 and 0.0 <= step["reward/environment/mean"] <= 1.0
    assert step["tools/turns/max"] <= 4 and step["tools/failed_episodes"] == 0.0
    assert step["tools/environment_done"] == 16  # every game ended by the game: the number, or its 4th guess
    for record in (r for r in read_samples(tmp_path / "run") if r["kind"] == "train"):
        assert record["reward"] in (0.0, 1.0) and set(record["graders"]) == {"environment"}
        hints = [m["content"] for m in record["turns"] if m["role"] == "tool"]
        assert (hints[-1] == "correct") == (record["reward"] == 1.0)
