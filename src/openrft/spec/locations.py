"""Where models, datasets and outputs live: local paths, ``file://`` URIs, or object-store URIs."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

REMOTE_SCHEMES = ("s3", "gs", "gcs", "http", "https", "hf")


def is_remote(location: str) -> bool:
    return urlparse(location).scheme in REMOTE_SCHEMES


def resolve_location(value: str | None, base_dir: Path, model: bool = False) -> str | None:
    """Turn a user-written location into an absolute path, or keep a remote URI as it is.

    Relative paths are read against the job file's directory. For a model, a value that is not an
    existing path is kept as a name (``openrft-demo``, ``Qwen/Qwen2.5-0.5B-Instruct``).
    """
    if value is None:
        return None
    parsed = urlparse(value)
    if parsed.scheme == "file":
        return str(Path(unquote(parsed.netloc + parsed.path)).resolve())
    if parsed.scheme in REMOTE_SCHEMES:
        return value
    path = Path(value).expanduser()
    if not path.is_absolute():
        candidate = base_dir / path
        if model and not candidate.exists():
            return value
        path = candidate
    return str(path.resolve())
