"""Jobs in the shapes the services publish (the Vertex quick start's Cloud Run request, the OpenAI
cookbook's score_model job) load unchanged, say in one line what a cloud-only name needs, and train two
steps on the demo model once those names are mapped with ``--map``. The fixtures are OpenRFT's own,
written in the published shapes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from openrft.cli import main
from tests.rewards.chat_server import ChatServer, DemoChatModel

ROOT = Path(__file__).resolve().parents[2]
ARITHMETIC = ROOT / "examples" / "arithmetic"
CLOUD_RUN = "https://reward-fn-5x7kq2-uc.a.run.app"


def head(source: Path, target: Path, lines: int) -> str:
    target.write_text("".join(source.read_text().splitlines(keepends=True)[:lines]))
    return str(target)


def vertex_request() -> dict:
    """The quick start's request body: gs:// datasets, a Gemini model, a Cloud Run reward."""
    return {
        "tunedModelDisplayName": "arithmetic-rft",
        "baseModel": "gemini-2.5-flash",
        "reinforcementTuningSpec": {
            "trainingDatasetUri": "gs://my-bucket/rft/train.jsonl",
            "validationDatasetUri": "gs://my-bucket/rft/eval.jsonl",
            "hyperParameters": {
                "epochCount": "2",
                "learningRateMultiplier": 1.0,
                "samplesPerPrompt": 4,
                "adapterSize": "ADAPTER_SIZE_FOUR",
                "maxOutputTokens": 8,
                "batchSize": 4,
                "evaluateInterval": 5,
                "checkpointInterval": 5,
                "thinkingLevel": "MEDIUM",
            },
            "singleRewardConfig": {
                "rewardName": "correct",
                "parseResponseConfig": {"parseType": "IDENTITY"},
                "cloudRunRewardScorer": {"cloudRunUri": CLOUD_RUN},
            },
        },
    }


def openai_job() -> dict:
    """The cookbook's job payload: file ids, a hosted model, a score_model grader judged by a hosted model."""
    return {
        "training_file": "file-4Tq9Xz2HcWbR1mN8vLp3Ks",
        "validation_file": "file-7Hd2Kq9Wm3Zx8Rt5Np1Lc",
        "model": "o4-mini-2025-04-16",
        "suffix": "arithmetic_judge",
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": {
                    "type": "score_model",
                    "name": "judge",
                    "input": [
                        {"role": "system", "content": 'Return exactly {"steps": [...], "result": <float 0-1>}.'},
                        {
                            "role": "user",
                            "content": "Reference Answer: {{item.reference_answer}}. Model's Answer: "
                            "{{sample.output_text}}",
                        },
                    ],
                    "pass_threshold": 0.75,
                    "model": "gpt-4.1-2025-04-14",
                    "range": [0, 1],
                    "sampling_params": {"seed": 42, "temperature": 0},
                },
                "response_format": None,
                "hyperparameters": {
                    "compute_multiplier": 0.25,
                    "eval_samples": 1,
                    "eval_interval": 5,
                    "n_epochs": 1,
                    "batch_size": 4,
                    "reasoning_effort": "medium",
                },
            },
        },
        "seed": 42,
    }


class CloudRunReward(BaseHTTPRequestHandler):
    """A Cloud Run reward written as the REST reference documents it."""

    seen: ClassVar[list[dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        text = body["response"]["parts"][0]["text"]
        reward = 1.0 if text.strip() == body["example"]["references"]["ground_truth_answer"] else -1.0
        data = json.dumps({"reward": reward}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def write(tmp_path: Path, name: str, doc: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2))
    return str(path)


@pytest.mark.slow
def test_vertex_quick_start_request_trains_with_mapped_names(tmp_path, capsys):
    job = write(tmp_path, "request.json", vertex_request())
    train = head(ARITHMETIC / "vertex_train.jsonl", tmp_path / "train.jsonl", 16)
    evals = head(ARITHMETIC / "vertex_validation.jsonl", tmp_path / "eval.jsonl", 8)
    datasets = ["--map", f"gs://my-bucket/rft/train.jsonl={train}", "--map", f"gs://my-bucket/rft/eval.jsonl={evals}"]
    assert main(["spec", "validate", job, *datasets]) == 0  # valid as written; its model is to map
    out = capsys.readouterr().out
    assert "--map-model 'gemini-2.5-flash=openrft-demo'" in out
    assert out.splitlines()[-1] == f"to train here: openrft train {job} --map-model 'gemini-2.5-flash=MODEL'"
    model = ["--map-model", "gemini-2.5-flash=openrft-demo"]
    assert main(["spec", "validate", job, *datasets, *model]) == 0
    assert "valid:" in capsys.readouterr().out

    server = ThreadingHTTPServer(("127.0.0.1", 0), CloudRunReward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    local_reward = f"http://127.0.0.1:{server.server_address[1]}/"
    CloudRunReward.seen.clear()
    try:
        args = [
            "train",
            job,
            *datasets,
            "--map-model",
            "gemini-2.5-flash=openrft-demo",
            "--map",
            f"{CLOUD_RUN}={local_reward}",
        ]
        assert main([*args, "--steps", "2", "--output", str(tmp_path / "run"), "--quiet"]) == 0
    finally:
        server.shutdown()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 2 and summary["base_model"] == "openrft-demo"
    spec = json.loads((tmp_path / "run" / "spec.json").read_text())
    assert spec["sampling"]["reasoning_effort"] == "medium" and spec["lora"]["rank"] == 4
    sample = CloudRunReward.seen[-1]
    assert sample["response"]["role"] == "model" and set(sample["response"]) == {"role", "parts"}
    assert sample["example"]["contents"][0]["role"] == "user"
    # 2 steps × 4 prompts × 4 samples, plus the validation set (8 prompts, 1 sample) before training and after
    assert len(CloudRunReward.seen) == 2 * 4 * 4 + 2 * 8


@pytest.fixture(scope="module")
def judge():
    with ChatServer(DemoChatModel()) as server:
        yield server


def test_cookbook_job_says_in_one_line_what_to_map(tmp_path, monkeypatch, capsys):
    for name in ("OPENRFT_JUDGE_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    job = write(tmp_path, "job.json", openai_job())
    assert main(["spec", "validate", job]) == 0  # valid as written: what it names in OpenAI's cloud is to map
    out = capsys.readouterr().out
    for file_id in ("file-4Tq9Xz2HcWbR1mN8vLp3Ks", "file-7Hd2Kq9Wm3Zx8Rt5Np1Lc"):
        line = next(line for line in out.splitlines() if file_id in line)
        assert f"--map {file_id}=PATH" in line
    assert "--map-model 'o4-mini-2025-04-16=openrft-demo'" in out
    assert out.splitlines()[-1] == (
        f"to train here: openrft train {job} --map-model 'o4-mini-2025-04-16=MODEL' "
        "--map file-4Tq9Xz2HcWbR1mN8vLp3Ks=PATH --map file-7Hd2Kq9Wm3Zx8Rt5Np1Lc=PATH"
    )
    assert main(["train", job, "--output", str(tmp_path / "run"), "--quiet"]) == 2  # train refuses it unmapped
    assert "3 problem(s)" in capsys.readouterr().err
    train = head(ARITHMETIC / "train.jsonl", tmp_path / "train.jsonl", 16)
    mapped = [
        *("--map", f"file-4Tq9Xz2HcWbR1mN8vLp3Ks={train}", "--map", f"file-7Hd2Kq9Wm3Zx8Rt5Np1Lc={train}"),
        *("--map-model", "o4-mini-2025-04-16=openrft-demo"),
    ]
    assert main(["spec", "validate", job, *mapped]) == 2
    err = capsys.readouterr().err
    assert "is an LLM judge but no endpoint is set: point OPENRFT_JUDGE_BASE_URL" in err
    assert "--map MODEL=LOCAL_MODEL" in err


@pytest.mark.slow
def test_cookbook_score_model_job_trains_with_a_local_judge(tmp_path, monkeypatch, judge, capsys):
    monkeypatch.setenv("OPENRFT_JUDGE_BASE_URL", judge.base_url)
    job = write(tmp_path, "job.json", openai_job())
    train = head(ARITHMETIC / "train.jsonl", tmp_path / "train.jsonl", 16)
    evals = head(ARITHMETIC / "validation.jsonl", tmp_path / "validation.jsonl", 4)
    mapped = [
        *("--map", f"file-4Tq9Xz2HcWbR1mN8vLp3Ks={train}", "--map", f"file-7Hd2Kq9Wm3Zx8Rt5Np1Lc={evals}"),
        *("--map-model", "o4-mini-2025-04-16=openrft-demo", "--map", "gpt-4.1-2025-04-14=local-judge"),
    ]
    assert main(["spec", "validate", job, *mapped]) == 0
    before = len(judge.requests)
    assert main(["train", job, *mapped, "--steps", "2", "--output", str(tmp_path / "run"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    sent = [r["body"] for r in judge.requests[before:]]
    assert len(sent) == 2 * 4 * 4 + 2 * 4  # one judge call per sample: 2 steps × 4 prompts × 4, and 2 evaluations
    assert all(b["model"] == "local-judge" and b["seed"] == 42 and b["temperature"] == 0 for b in sent)
    assert all(b["response_format"]["json_schema"]["schema"]["required"] == ["steps", "result"] for b in sent)
    assert "Reference Answer: " in sent[0]["messages"][1]["content"]
    warnings = capsys.readouterr().out
    assert "response_format" not in warnings  # null response_format is simply absent
