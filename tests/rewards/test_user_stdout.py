"""What user reward code prints never mixes into OpenRFT's machine-readable output."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from openrft.rewards.capture import captured_stdout
from tests.rewards.helpers import ROOT, require_bwrap

CALLABLE = """
print("imported")  # import-time output goes to stderr


def score(batch):
    print("scoring", len(batch), "sample(s)")
    return [1.0 if s["completion"].strip() == s["reference_answer"] else 0.0 for s in batch]
"""

PYTHON_GRADER = {
    "type": "python",
    "source": "def grade(sample, item):\n    print('debug:', sample['output_text'])\n    return 0.5\n",
}


def rewards_test(tmp_path: Path, config: dict) -> subprocess.CompletedProcess:
    (tmp_path / "config.json").write_text(json.dumps(config))
    line = {"messages": [{"role": "user", "content": "2+3?"}], "reference_answer": "5"}
    (tmp_path / "line.json").write_text(json.dumps(line))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{tmp_path}"}
    command = [
        sys.executable,
        "-c",
        "import sys; from openrft.cli import main; sys.exit(main())",
        "rewards",
        "test",
        "config.json",
        "--example",
        "line.json",
    ]
    return subprocess.run(
        [*command, "--response", "5", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_in_process_callable_prints_are_reported_apart_from_the_json(tmp_path):
    (tmp_path / "noisy_reward.py").write_text(CALLABLE)
    done = rewards_test(tmp_path, {"function": {"type": "callable", "target": "noisy_reward:score"}})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # stdout is exactly one JSON document
    assert result["score"] == 1.0 and result["stdout"] == "scoring 1 sample(s)\n"
    assert "imported" in done.stderr


def test_sandboxed_python_grader_prints_are_reported_apart_from_the_json(tmp_path):
    require_bwrap()
    done = rewards_test(tmp_path, PYTHON_GRADER)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["score"] == 0.5 and result["stdout"] == "debug: 5\n"


def test_captures_follow_their_own_thread_and_leave_the_rest_alone(capsys):
    seen = {}

    def work(name):
        with captured_stdout() as buffer:
            print(f"from {name}")
        seen[name] = buffer.getvalue()

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b", "c")]
    print("before")
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("after")
    assert seen == {"a": "from a\n", "b": "from b\n", "c": "from c\n"}
    assert capsys.readouterr().out == "before\nafter\n"


def test_output_log_writes_each_output_once_per_step():
    from openrft.rewards.capture import output_log

    printed = [("example a, sample 0", "batch\n"), ("example a, sample 1", "batch\n"), ("example b, sample 0", "")]
    assert output_log(3, printed) == "--- step 3, example a, sample 0\nbatch\n"
    assert output_log(1, [("x", "no newline")]) == "--- step 1, x\nno newline\n"


@pytest.mark.slow
def test_training_keeps_reward_prints_in_the_run_directory(tmp_path, capsys):
    require_bwrap()
    from openrft.cli import main

    train = tmp_path / "train.jsonl"
    train.write_text("".join((ROOT / "examples/arithmetic/train.jsonl").read_text().splitlines(keepends=True)[:8]))
    job = {
        "model": "openrft-demo",
        "training_file": str(train),
        "validation_file": str(train),
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": {
                    "type": "python",
                    # a print unique to each call: two samples of one prompt may well give the same text
                    "source": "import uuid\n\ndef grade(sample, item):\n    print('graded', sample['output_text'], "
                    "uuid.uuid4())\n    return 0.5\n",
                },
                "hyperparameters": {"batch_size": 2, "compute_multiplier": 0.125, "n_epochs": 1},
            },
        },
        "openrft": {"max_new_tokens": 4, "eval_at_start": False},
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    run = tmp_path / "run"
    assert main(["train", str(tmp_path / "job.json"), "--steps", "1", "--output", str(run), "--quiet"]) == 0
    log = (run / "reward_output.log").read_text()
    assert log.startswith("--- step 1, example ") and log.count("graded ") == 2 * 2  # 2 prompts × 2 samples
    assert "graded" not in capsys.readouterr().out
