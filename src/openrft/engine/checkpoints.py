"""Checkpoints: everything needed to resume, written atomically; the best ``keep_top_k`` kept.

Layout of a run directory::

    spec.json                 the resolved JobSpec the run was started with
    metrics.jsonl             one line per step
    checkpoints/step-000010/  adapter/ (PEFT format), trainer_state.pt, checkpoint.json
    adapter/                  the final adapter (PEFT format)
    manifest.json, summary.json
"""

from __future__ import annotations

import errno
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from openrft.errors import CheckpointError

STATE_FILE = "trainer_state.pt"
INFO_FILE = "checkpoint.json"


@dataclass
class CheckpointInfo:
    step: int
    path: str
    val_reward: float | None
    policy_version: int


def _rank_key(info: CheckpointInfo) -> tuple[bool, float, int]:
    """Best first: evaluated before unevaluated, higher validation reward, later step."""
    return (info.val_reward is not None, info.val_reward if info.val_reward is not None else 0.0, info.step)


class CheckpointManager:
    def __init__(self, run_dir: Path, keep_top_k: int):
        self.root = run_dir / "checkpoints"
        self.keep_top_k = keep_top_k

    def list(self) -> list[CheckpointInfo]:
        if not self.root.exists():
            return []
        infos = []
        for info_path in sorted(self.root.glob(f"step-*/{INFO_FILE}")):
            infos.append(CheckpointInfo(**json.loads(info_path.read_text())))
        return sorted(infos, key=lambda i: i.step)

    def latest(self) -> CheckpointInfo | None:
        infos = self.list()
        return infos[-1] if infos else None

    def best(self) -> CheckpointInfo | None:
        infos = self.list()
        return max(infos, key=_rank_key) if infos else None

    def save(
        self, step: int, model: torch.nn.Module, state: dict[str, Any], val_reward: float | None, policy_version: int
    ) -> CheckpointInfo:
        """Write into a temporary directory, then rename: a crash never leaves a half checkpoint."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step-{step:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".step-{step:06d}-", dir=self.root))
        try:
            save_adapter(model, tmp / "adapter")
            with (tmp / STATE_FILE).open("wb") as f:  # through a Python file: a full disk is an OSError
                torch.save(state, f)
            info = CheckpointInfo(step=step, path=str(final), val_reward=val_reward, policy_version=policy_version)
            (tmp / INFO_FILE).write_text(json.dumps(asdict(info), indent=2))
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if _disk_full(exc):
                raise CheckpointError(
                    f"no space left on the device of {self.root} to write the checkpoint of step {step}: "
                    "free some space and resume the job"
                ) from None
            raise
        self._prune(keep_step=step)
        return info

    def remove_partial(self) -> list[str]:
        """Remove the temporary directories of checkpoints whose writing was cut short (the process was
        killed between ``mkdtemp`` and ``rename``); called by the one process that writes this run."""
        if not self.root.exists():
            return []
        partial = sorted(p for p in self.root.glob(".step-*") if p.is_dir())
        for path in partial:
            shutil.rmtree(path, ignore_errors=True)
        return [p.name for p in partial]

    def _prune(self, keep_step: int) -> None:
        """Keep the newest checkpoint (to resume from) and the top-k by validation reward."""
        infos = self.list()
        keep = {keep_step} | {i.step for i in sorted(infos, key=_rank_key, reverse=True)[: self.keep_top_k]}
        for info in infos:
            if info.step not in keep:
                shutil.rmtree(info.path, ignore_errors=True)

    def load_state(self, info: CheckpointInfo) -> dict[str, Any]:
        path = Path(info.path) / STATE_FILE
        if not path.exists():
            raise CheckpointError(f"checkpoint {info.path} has no {STATE_FILE}")
        return torch.load(path, map_location="cpu", weights_only=False)


def _disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from or during) is a full disk or quota."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def save_adapter(model: torch.nn.Module, directory: Path) -> None:
    """The policy in PEFT format (``PeftModel.from_pretrained``), or a full model without LoRA."""
    from peft import PeftModel

    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(model, PeftModel):
        model.save_pretrained(str(directory), selected_adapters=["default"])
    else:
        model.save_pretrained(str(directory))
