"""Saved states and sampler weights on disk, addressed as ``tinker://MODEL_ID/weights/NAME`` (training
state: adapter and AdamW state), ``tinker://MODEL_ID/sampler_weights/NAME`` (adapter only) or
``tinker://MODEL_ID/external_weights/NAME`` (a PEFT adapter directory, for download).

Each checkpoint is a directory written under a temporary name and renamed, so a crash never leaves a
half-written one; its ``meta.json`` names the owner, so another tenant's path reads as not found unless its
owner published it (then it can be read, never changed), and its expiry (``expires_at``), after which it
reads as not found and is removed."""

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
EXTERNAL = "external_weights"
ALL_KINDS = {**KINDS, EXTERNAL: "external"}  # the SDK's checkpoint_type of each path segment
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:-]{0,127}$")  # SESSION:train:SEQ


class CheckpointError(ValueError):
    """A path or name the store cannot use; the message names it."""


class PastQuota(CheckpointError):
    """A save that would take its owner past the storage quota (413 where a route can answer so)."""


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


def parse_any(path: str) -> Location:
    """A path of any kind, external weights included (what the REST routes address)."""
    if not path.startswith("tinker://"):
        raise CheckpointError(f"path {path!r} is not a tinker:// path (tinker://MODEL_ID/weights/NAME)")
    parts = path[len("tinker://") :].split("/")
    if len(parts) != 3 or parts[1] not in ALL_KINDS or not (MODEL_ID.match(parts[0]) and NAME.match(parts[2])):
        kinds = ", ".join(ALL_KINDS)
        raise CheckpointError(f"path {path!r} is not tinker://MODEL_ID/KIND/NAME with KIND one of {kinds}")
    return Location(*parts)


def expired(meta: dict, at: float | None = None) -> bool:
    expires = meta.get("expires_at")
    return expires is not None and expires <= (time.time() if at is None else at)


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


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


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

    def owner_bytes(self, owner: str) -> int:
        """The bytes of ``owner``'s checkpoints (counted in its storage quota with its files): counted on disk
        each time, so a checkpoint removed any way is no longer counted."""
        total = 0
        for entry in self.root.glob("*/*/*") if self.root.is_dir() else []:
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                if json.loads((entry / "meta.json").read_text()).get("owner") == owner:
                    total += _size(entry)
            except (OSError, ValueError, AttributeError):
                continue
        return total

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

    def save(
        self,
        loc: Location,
        owner: str,
        meta: dict,
        tensors: dict,
        overwrite: bool = False,
        room: int | None = None,
    ) -> None:
        """Writes the checkpoint; with ``room`` (the bytes its owner may still store besides its checkpoints),
        refused (``PastQuota``, nothing kept) when its owner's checkpoints would take more."""
        final = self._dir(loc)
        if final.exists() and not overwrite:
            raise CheckpointError(f"checkpoint {loc.tinker_path} exists (pass overwrite=True to replace it)")
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{loc.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            torch.save(tensors, tmp / "state.pt")
            (tmp / "meta.json").write_text(json.dumps({**meta, "owner": owner, "time": time.time()}))
            used, size, replaced = self.owner_bytes(owner), _size(tmp), _size(final) if final.exists() else 0
            if room is not None and used - replaced + size > room:
                raise PastQuota(
                    f"saving {loc.tinker_path} ({size:,} bytes) would take this API key's files and Tinker "
                    f"checkpoints past the service's limit of stored bytes per API key (--max-stored-mb): "
                    f"{used:,} bytes of checkpoints stored, room for {max(room, 0):,}; nothing was saved"
                )
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        except BaseException as exc:
            full = isinstance(exc, Exception) and _out_of_space(final.parent)  # torch's own error does not say so
            shutil.rmtree(tmp, ignore_errors=True)
            if full:
                raise OSError(errno.ENOSPC, f"No space left on device (saving {loc.tinker_path})") from exc
            raise

    def meta(self, loc: Location, owner: str, owned: bool = False) -> dict:
        """The checkpoint's metadata if ``owner`` may read it: its own, or one its owner published (only its own
        with ``owned``); else it is not found, as an expired one is."""
        path = self._dir(loc) / "meta.json"
        if not path.exists():
            raise CheckpointError(f"no checkpoint {loc.tinker_path}")
        meta = json.loads(path.read_text())
        readable = meta.get("owner") == owner or (bool(meta.get("public")) and not owned)
        if not readable or expired(meta):
            raise CheckpointError(f"no checkpoint {loc.tinker_path}")
        return meta

    def load(self, loc: Location, owner: str) -> tuple[dict, dict]:
        meta = self.meta(loc, owner)
        return meta, torch.load(self._dir(loc) / "state.pt", weights_only=True)

    def list(self, model_id: str, owner: str) -> list[tuple[Location, dict, int]]:
        """``owner``'s own checkpoints of ``model_id`` of every kind, oldest first; expired ones are removed."""
        found = []
        for kind in ALL_KINDS:
            folder = self.root / model_id / kind
            for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
                if entry.name.startswith("."):
                    continue
                loc = Location(model_id, kind, entry.name)
                try:
                    meta = json.loads((entry / "meta.json").read_text())
                except (OSError, ValueError):
                    continue
                if not isinstance(meta, dict) or meta.get("owner") != owner:
                    continue
                if expired(meta):
                    self._remove(loc)
                    continue
                found.append((loc, meta, self.size(loc)))
        return sorted(found, key=lambda item: (item[1].get("time", 0), item[0].tinker_path))

    def model_ids(self) -> list[str]:
        """The runs with a folder here (any owner's: ``list`` filters)."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []

    def files(self, loc: Location) -> dict[str, Path]:
        """The checkpoint's own files (its metadata left out), by their path inside it."""
        folder = self._dir(loc)
        found = {}
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder).as_posix()
            if path.is_file() and not path.is_symlink() and relative != "meta.json":
                found[relative] = path
        return found

    def size(self, loc: Location) -> int:
        return sum(path.stat().st_size for path in self.files(loc).values())

    def write(self, loc: Location, owner: str, meta: dict, fill) -> None:
        """A checkpoint whose files ``fill(folder)`` writes (external weights), renamed into place whole; an
        existing one of that name is replaced."""
        final = self._dir(loc)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{loc.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            fill(tmp)
            (tmp / "meta.json").write_text(json.dumps({**meta, "owner": owner, "time": time.time()}))
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._recount()

    def update(self, loc: Location, owner: str, **fields) -> dict:
        """Sets ``fields`` in ``owner``'s own checkpoint's metadata (another owner's, published or not, reads as
        not found); the file is replaced whole."""
        meta = {**self.meta(loc, owner, owned=True), **fields}
        path = self._dir(loc) / "meta.json"
        tmp = path.with_name(f".meta.json.tmp-{os.getpid()}-{time.monotonic_ns()}")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path)
        return meta

    def detach(self, loc: Location, owner: str) -> Path:
        """Takes ``owner``'s own checkpoint out of reach at once, renamed under a temporary name (which ``sweep``
        removes should this process die): where it now is, for ``purge`` or ``restore``."""
        self.meta(loc, owner, owned=True)
        final = self._dir(loc)
        moved = final.parent / f".{loc.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        final.rename(moved)
        return moved

    def restore(self, loc: Location, moved: Path) -> None:
        moved.rename(self._dir(loc))

    def purge(self, moved: Path) -> None:
        shutil.rmtree(moved)
        self._recount()

    def _remove(self, loc: Location) -> None:
        final = self._dir(loc)
        moved = final.parent / f".{loc.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
        try:
            final.rename(moved)
        except OSError:
            return
        self.purge(moved)

    def _recount(self) -> None:
        if getattr(self, "_bytes", None) is not None:  # the owners' stored bytes, if kept: counted again when asked
            self._bytes = None
