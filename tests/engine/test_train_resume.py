"""A few real RFT steps on the demo model: the adapter learns, the loss is finite, resume is exact."""

import json
import math

import torch
from peft import PeftModel

from openrft.engine import RFTJob, StopAfter
from openrft.engine.checkpoints import CheckpointManager
from openrft.models import load_causal_lm
from openrft.spec.dialects import load_job


def _adapter_at(run_dir, step):
    info = next(i for i in CheckpointManager(run_dir, 10).list() if i.step == step)
    return CheckpointManager(run_dir, 10).load_state(info)["learner"]["adapter"]


def test_training_changes_adapter_and_writes_outputs(recipe_factory, tmp_path):
    spec = load_job(recipe_factory(max_steps=3))
    run_dir = tmp_path / "run"
    summary = RFTJob(spec, run_dir, show_progress=False).run()

    assert summary["status"] == "succeeded" and summary["steps"] == 3
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "val-score/rewards/mean@1" in rows[0] and "val-score/rewards/mean@1" in rows[-1]
    for row in rows[1:]:
        assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/grad_norm"])
        assert 0.0 <= row["critic/rewards/mean"] <= 1.0
        assert row["actor/kl"] >= 0
        for name in (
            "response_length/mean",
            "prompt_length/max",
            "perf/throughput",
            "perf/time_per_step",
            "perf/cpu_memory_used_gb",
            "actor/entropy",
            "actor/pg_clipfrac",
        ):
            assert name in row
    assert any(r["actor/grad_norm"] > 0 for r in rows[1:])

    # the adapter moved away from its initialisation (LoRA B starts at zero)
    adapter = _adapter_at(run_dir, 3)
    b_norm = sum(v.abs().sum().item() for k, v in adapter.items() if "lora_B" in k)
    assert b_norm > 0

    # the final adapter loads with PEFT and gives different logits from the base model
    base = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    ids = torch.tensor([[1, 60, 40, 10]])
    base_logits = base(input_ids=ids).logits
    tuned = PeftModel.from_pretrained(base, str(run_dir / "adapter"))
    assert not torch.allclose(base_logits, tuned(input_ids=ids).logits)

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["checkpoint_path"] == str((run_dir / "adapter").resolve())
    summary_file = json.loads((run_dir / "summary.json").read_text())
    assert summary_file["baseline_val_reward"] is not None and summary_file["wall_seconds"] > 0


def test_stop_and_resume_reproduces_uninterrupted_run(recipe_factory, tmp_path):
    spec = load_job(recipe_factory(max_steps=4))
    straight = tmp_path / "straight"
    RFTJob(spec, straight, show_progress=False).run()

    interrupted = tmp_path / "interrupted"
    first = RFTJob(spec, interrupted, show_progress=False, control=StopAfter(2)).run()
    assert first["status"] == "paused" and first["steps"] == 2
    assert not (interrupted / "adapter").exists()
    leftover = interrupted / "checkpoints" / ".step-000003-killed"  # a process killed while writing step 3
    leftover.mkdir()
    (leftover / "trainer_state.pt").write_bytes(b"half")
    second = RFTJob.from_run_dir(interrupted, show_progress=False).run()
    assert second["status"] == "succeeded" and second["steps"] == 4
    assert not leftover.exists() and not list((interrupted / "checkpoints").glob(".step-*"))

    expected, resumed = _adapter_at(straight, 4), _adapter_at(interrupted, 4)
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name
    steps = [json.loads(line)["step"] for line in (interrupted / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]


def test_a_full_disk_while_checkpointing_is_a_checkpoint_error(tmp_path, monkeypatch):
    """The state file lands on /dev/full (every write fails with ENOSPC): a CheckpointError naming the cause,
    and no temporary directory left behind."""
    import os

    import pytest

    from openrft.engine import checkpoints
    from openrft.errors import CheckpointError

    manager = CheckpointManager(tmp_path / "run", 3)
    full = tmp_path / "run" / "checkpoints" / ".step-000001-full"

    def on_full_disk(prefix, dir):
        full.mkdir(parents=True)
        os.symlink("/dev/full", full / checkpoints.STATE_FILE)
        return str(full)

    monkeypatch.setattr(checkpoints.tempfile, "mkdtemp", on_full_disk)
    model = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float32)
    with pytest.raises(CheckpointError, match="no space left on the device"):
        manager.save(1, model, {"x": torch.zeros(1000)}, None, 1)
    assert not full.exists() and manager.list() == []
