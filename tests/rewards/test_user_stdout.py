"""What user reward code prints never mixes into OpenRFT's machine-readable output."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

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
