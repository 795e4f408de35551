"""The bundled demo model and the script that builds it."""

import hashlib
import sys
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from openrft.models import resolve_model_path
from tests.processes import run_at_once

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_demo_model.py"
DATA = ROOT / "examples" / "arithmetic"


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def build_command(out: Path, steps: int) -> list[str]:
    return [
        sys.executable,
        str(SCRIPT),
        "--steps",
        str(steps),
        "--model-dir",
        str(out / "model"),
        "--data-dir",
        str(out / "data"),
    ]


def test_the_bundled_model_loads_with_the_auto_classes_and_is_small():
    path = Path(resolve_model_path("openrft-demo"))
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert sum(f.stat().st_size for f in path.iterdir()) < 5 * 2**20
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(tokenizer("What is 12-7?")["input_ids"]) == "What is 12-7?"


def test_rebuilding_is_byte_identical_and_writes_the_committed_data(tmp_path):
    # the two builds run at once (each on one thread), so a rebuild that depended on timing would differ too
    run_at_once([build_command(tmp_path / "a", steps=20), build_command(tmp_path / "b", steps=20)], timeout=300)
    assert digests(tmp_path / "a" / "model") == digests(tmp_path / "b" / "model")
    written = digests(tmp_path / "a" / "data")
    assert set(written) == {"train.jsonl", "validation.jsonl", "vertex_train.jsonl", "vertex_validation.jsonl"}
    assert written == {name: digests(DATA)[name] for name in written}
