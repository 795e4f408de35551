"""Where a job's outputs end up: the local run directory, mirrored to an object store when the job names one.

A remote output location (``run.output_s3_path: s3://bucket/out``) means: the job trains into a local
staging run directory as usual, and the directory is mirrored to the URI at every checkpoint and at the
end (adapter, checkpoints, manifest, summary, metrics, spec, TensorBoard). The location is checked
(bucket exists, writable) before anything is loaded, so a typo fails in seconds, not after training.
"""

from __future__ import annotations

from pathlib import Path

from openrft.errors import OpenRFTError
from openrft.spec.locations import is_remote
from openrft.storage import (
    OBJECT_STORE_SCHEMES,
    StorageError,
    check_output_location,
    holds_file,
    is_object_store,
    join,
    list_names,
    remove_tree,
    upload_file,
)

CHECKPOINTS = "checkpoints"


def output_mirror(output_dir: str | None, run_dir: Path) -> OutputMirror | None:
    """The mirror of a job whose output location is an object-store URI; None for a local one."""
    if output_dir is None or not is_remote(output_dir):
        return None
    if not is_object_store(output_dir):
        schemes = ", ".join(f"{s}://" for s in OBJECT_STORE_SCHEMES)
        raise OpenRFTError(f"output location {output_dir}: outputs go to a local path or file:// URI, or to {schemes}")
    return OutputMirror(run_dir, output_dir)


def _is_temporary(relative: Path) -> bool:
    """Files being written: ``*.tmp`` (atomic JSON writes) and ``checkpoints/.step-*`` (a checkpoint in progress)."""
    return relative.suffix == ".tmp" or any(part.startswith(".") for part in relative.parts)


class OutputMirror:
    """Keeps ``uri`` a copy of ``run_dir``: files new or changed since the last sync are uploaded, checkpoints
    pruned locally (top-k) are removed remotely."""

    def __init__(self, run_dir: Path, uri: str):
        self.run_dir = run_dir
        self.uri = uri.rstrip("/")
        self._sent: dict[str, tuple[int, int]] = {}
        self._remote_checkpoints: set[str] = set()

    def uri_of(self, path: Path | str) -> str:
        """The URI a file or directory of the run directory is mirrored to."""
        return join(self.uri, Path(path).resolve().relative_to(self.run_dir.resolve()).as_posix())

    def check(self, resuming: bool) -> None:
        """Before training: the location is writable, and holds no other run (a resumed run may be there)."""
        check_output_location(self.uri)
        if not resuming and holds_file(join(self.uri, "spec.json")):
            raise StorageError(
                self.uri,
                "already holds an OpenRFT run (spec.json): choose another output location, "
                "resume that run, or remove it",
            )
        self._remote_checkpoints = {n for n in list_names(join(self.uri, CHECKPOINTS)) if n.startswith("step-")}

    def sync(self) -> int:
        """Upload what changed since the last sync; returns the number of files uploaded."""
        uploaded = 0
        for file in sorted(p for p in self.run_dir.rglob("*") if p.is_file()):
            relative = file.relative_to(self.run_dir)
            if _is_temporary(relative):
                continue
            stat = file.stat()
            key, signature = relative.as_posix(), (stat.st_size, stat.st_mtime_ns)
            if self._sent.get(key) != signature:
                upload_file(file, join(self.uri, key))
                self._sent[key] = signature
                uploaded += 1
        local = {p.name for p in (self.run_dir / CHECKPOINTS).glob("step-*") if p.is_dir()}
        for name in sorted(self._remote_checkpoints - local):
            remove_tree(join(self.uri, CHECKPOINTS, name))
            prefix = f"{CHECKPOINTS}/{name}/"
            self._sent = {k: v for k, v in self._sent.items() if not k.startswith(prefix)}
        self._remote_checkpoints = local
        return uploaded
