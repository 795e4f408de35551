"""Saved states and sampler weights on disk, addressed as ``tinker://MODEL_ID/weights/NAME`` (training
state: adapter and AdamW state) or ``tinker://MODEL_ID/sampler_weights/NAME`` (adapter only).

Each checkpoint is a directory written under a temporary name and renamed, so a crash never leaves a
half-written one; its ``meta.json`` names the owner, so another tenant's path reads as not found."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

KINDS = {"weights": "training", "sampler_weights": "sampler"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:-]{0,127}$")  # SESSION:train:SEQ


class CheckpointError(ValueError):
    """A path or name the store cannot use; the message names it."""


@dataclass
class Location:
    model_id: str
    kind: str  # weights | sampler_weights
    name: str

    @property
    def tinker_path(self) -> str:
        return f"tinker://{self.model_id}/{self.kind}/{self.name}"


def parse(path: str) -> Location:
    if not path.startswith("tinker://"):
        raise CheckpointError(f"path {path!r} is not a tinker:// path (tinker://MODEL_ID/weights/NAME)")
    parts = path[len("tinker://") :].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not (MODEL_ID.match(parts[0]) and NAME.match(parts[2])):
        raise CheckpointError(f"path {path!r} is not tinker://MODEL_ID/weights/NAME or .../sampler_weights/NAME")
    return Location(*parts)


def check_name(name: str) -> None:
    if not NAME.match(name or ""):
        raise CheckpointError(f"checkpoint name {name!r} must match {NAME.pattern}")


TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-\d+$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _out_of_space(folder: Path, least: int = 1 << 20) -> bool:
    """Whether ``folder``'s disk has (almost) no room left."""
    try:
        return shutil.disk_usage(folder).free < least
    except OSError:
        return False


class CheckpointStore:
    def __init__(self, root: Path):
        self.root = root
        self.sweep()

    def sweep(self) -> list[Path]:
        """Remove the temporary directories of saves whose process is gone (killed mid-save): a save is
        renamed into place whole, so what is left under a temporary name is never a checkpoint."""
        removed = []
        for folder in self.root.glob("*/*") if self.root.is_dir() else []:
            for entry in folder.iterdir() if folder.is_dir() else []:
                match = TEMPORARY.match(entry.name)
                if match and entry.is_dir() and not _alive(int(match["pid"])):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
        return removed

    def _dir(self, loc: Location) -> Path:
        return self.root / loc.model_id / loc.kind / loc.name

    def save(self, loc: Location, owner: str, meta: dict, tensors: dict, overwrite: bool = False) -> None:
        final = self._dir(loc)
        if final.exists() and not overwrite:
            raise CheckpointError(f"checkpoint {loc.tinker_path} exists (pass overwrite=True to replace it)")
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{loc.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            torch.save(tensors, tmp / "state.pt")
            (tmp / "meta.json").write_text(json.dumps({**meta, "owner": owner, "time": time.time()}))
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        except BaseException as exc:
            full = isinstance(exc, Exception) and _out_of_space(final.parent)  # torch's own error does not say so
            shutil.rmtree(tmp, ignore_errors=True)
            if full:
                raise OSError(errno.ENOSPC, f"No space left on device (saving {loc.tinker_path})") from exc
            raise

    def meta(self, loc: Location, owner: str) -> dict:
        path = self._dir(loc) / "meta.json"
        if not path.exists():
            raise CheckpointError(f"no checkpoint {loc.tinker_path}")
        meta = json.loads(path.read_text())
        if meta.get("owner") != owner:
            raise CheckpointError(f"no checkpoint {loc.tinker_path}")
        return meta

    def load(self, loc: Location, owner: str) -> tuple[dict, dict]:
        meta = self.meta(loc, owner)
        return meta, torch.load(self._dir(loc) / "state.pt", weights_only=True)

    def list(self, model_id: str, owner: str) -> list[tuple[Location, dict, int]]:
        found = []
        for kind in KINDS:
            folder = self.root / model_id / kind
            for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
                if entry.name.startswith("."):
                    continue
                loc = Location(model_id, kind, entry.name)
                try:
                    meta = self.meta(loc, owner)
                except (CheckpointError, ValueError):
                    continue
                found.append((loc, meta, (entry / "state.pt").stat().st_size))
        return found
