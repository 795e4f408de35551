"""Object stores and local files behind one small interface (fsspec): ``s3://``, ``gs://``, ``file://`` and paths.

Datasets are read with ``read_text``; a job's outputs are written with ``upload_file`` / ``remove_tree`` and
checked before training with ``check_output_location``. Every error names the URI.

Credentials are whatever each store's own library reads, nothing of ours:

- S3 (``s3fs``, the ``s3`` extra): ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
  ``AWS_PROFILE`` and ``~/.aws/{credentials,config}``, instance roles; ``AWS_ENDPOINT_URL_S3`` or
  ``AWS_ENDPOINT_URL`` for an S3-compatible server (MinIO, moto, Ceph).
- GCS (``gcsfs``, the ``gcs`` extra): ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application-default
  credentials, the metadata server on GCP.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from openrft.errors import OpenRFTError

OBJECT_STORE_SCHEMES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}
"""URI scheme -> (the fsspec package that serves it, the openrft extra that installs it)."""


class StorageError(OpenRFTError):
    """A location that cannot be read or written; the message names the URI."""

    def __init__(self, uri: str, reason: str):
        self.uri = uri
        self.reason = reason
        super().__init__(f"{uri}: {reason}")


def is_object_store(location: str | None) -> bool:
    return location is not None and urlparse(location).scheme in OBJECT_STORE_SCHEMES


def join(uri: str, *parts: str) -> str:
    """``join("s3://b/out/", "adapter", "x.bin")`` -> ``s3://b/out/adapter/x.bin``."""
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts if p)])


HTTP_TIMEOUT_S = 60.0
"""How long a dataset URL may take between bytes (connect and each read)."""
REACH_TIMEOUT_S = 3.0
"""How long the object store's endpoint may take to accept a connection before a location is unreachable."""
_REACHED: dict[tuple[str, int], tuple[float, str | None]] = {}


def _endpoint(scheme: str) -> tuple[str, int]:
    """The host and port a scheme's store library connects to (the emulator/endpoint variables included)."""
    if scheme in ("s3", "s3a"):
        url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "https://s3.amazonaws.com"
    else:
        url = os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
    parsed = urlparse(url if "://" in url else f"http://{url}")
    return parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80)


def _probe(host: str, port: int) -> str | None:
    """None when ``host:port`` accepts a TCP connection within REACH_TIMEOUT_S, else why not. The name lookup
    runs in a daemon thread: the resolver's own timeouts can be much longer."""
    result: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
            result.append(None)
        except socket.gaierror as exc:
            result.append(f"its name does not resolve: {exc.strerror}")
        except OSError as exc:
            result.append(exc.strerror or type(exc).__name__)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(REACH_TIMEOUT_S)
    return result[0] if result else f"no answer within {REACH_TIMEOUT_S:g} s"


def check_reachable(uri: str) -> None:
    """Fail fast, in one line, when an object store cannot be reached at all (no network, a wrong endpoint),
    instead of the store library's minute of retries. Answers are remembered for a minute."""
    scheme = urlparse(uri).scheme
    if scheme not in OBJECT_STORE_SCHEMES:
        return
    host, port = _endpoint(scheme)
    when, reason = _REACHED.get((host, port), (0.0, None))
    if time.monotonic() - when > 60:
        reason = _probe(host, port)
        _REACHED[(host, port)] = (time.monotonic(), reason)
    if reason:
        variable = "AWS_ENDPOINT_URL_S3" if scheme.startswith("s3") else "STORAGE_EMULATOR_HOST"
        raise StorageError(
            uri,
            f"is unreachable: the object store {host}:{port} does not answer ({reason}); map it to a local path "
            f"(--map {uri}=PATH, or train --output DIR for an output location), or set {variable}",
        )


HTTP_SCHEMES = ("http", "https")


def _http_bytes(uri: str) -> bytes:
    """A dataset at an http(s) URL, fetched with a client of ``openrft.calls.endpoints`` (in a tenant's job, or
    while the service validates a tenant's job, it connects only to addresses the outbound policy checked then)."""
    import httpx

    from openrft.calls.endpoints import sync_client
    from openrft.calls.outbound import OutboundRefused

    try:
        with sync_client(timeout=HTTP_TIMEOUT_S) as client:
            response = client.get(uri)
    except OutboundRefused as exc:
        raise StorageError(uri, f"is not fetched: {exc}") from None
    except httpx.HTTPError as exc:
        raise StorageError(uri, f"cannot be read ({_describe(exc)})") from None
    if response.status_code in (404, 410):
        raise StorageError(uri, f"no such file (HTTP {response.status_code})")
    if response.status_code >= 400:
        raise StorageError(uri, f"cannot be read (HTTP {response.status_code})")
    return response.content


def _filesystem(uri: str) -> tuple[Any, str]:
    """The fsspec filesystem of a URI and the path within it; a missing store package, or a store that
    cannot be reached, is a clear error. An http(s) URL is a dataset to read (``read_bytes``), nothing more."""
    import fsspec

    scheme = urlparse(uri).scheme
    if scheme in HTTP_SCHEMES:
        raise StorageError(uri, "is an http(s) URL: a dataset is read from one; outputs go to a path or a bucket")
    check_reachable(uri)
    try:
        return fsspec.core.url_to_fs(uri)
    except ImportError as exc:
        if scheme not in OBJECT_STORE_SCHEMES:
            raise StorageError(uri, f"{scheme}:// locations need more packages ({exc})") from None
        package, extra = OBJECT_STORE_SCHEMES[scheme]
        raise StorageError(uri, f"{scheme}:// locations need {package}: pip install 'openrft[{extra}]'") from None
    except ValueError as exc:  # unknown protocol
        raise StorageError(uri, str(exc)) from None


def _bucket(fs: Any, path: str) -> str | None:
    """The bucket of an object-store path (``bucket/key`` -> ``bucket``); None for a local filesystem."""
    if "file" in _protocols(fs) or "local" in _protocols(fs):
        return None
    return path.split("/", 1)[0]


def _protocols(fs: Any) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _missing(fs: Any, path: str, uri: str) -> StorageError:
    """The error for a URI that is not there: names the bucket when it is the bucket that is missing."""
    bucket = _bucket(fs, path)
    if bucket is not None:
        try:
            bucket_exists = fs.exists(bucket)
        except Exception:
            bucket_exists = True
        if not bucket_exists:
            return StorageError(uri, f"bucket {bucket!r} does not exist (or these credentials cannot see it)")
    return StorageError(uri, "no such object or file")


def read_text(uri: str) -> str:
    """The whole text (UTF-8) at a URI or path."""
    data = read_bytes(uri)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StorageError(uri, f"is not UTF-8 text (byte {exc.start})") from None


def read_bytes(uri: str) -> bytes:
    """The whole content at a URI or path."""
    if urlparse(uri).scheme in HTTP_SCHEMES:
        return _http_bytes(uri)
    fs, path = _filesystem(uri)
    try:
        with fs.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise _missing(fs, path, uri) from None
    except IsADirectoryError:
        raise StorageError(uri, "is a directory, not a file") from None
    except Exception as exc:
        raise StorageError(uri, f"cannot be read ({_describe(exc)})") from None
    return data


def check_output_location(uri: str) -> None:
    """Fail before a job trains when its outputs could not be written: a missing bucket, no credentials,
    no write permission. Writes and removes a small marker object under ``uri``."""
    fs, path = _filesystem(uri)
    bucket = _bucket(fs, path)
    try:
        if bucket is not None and not fs.exists(bucket):
            raise StorageError(uri, f"bucket {bucket!r} does not exist (or these credentials cannot see it)")
        marker = join(path, f".openrft-write-check-{os.getpid()}")
        fs.pipe_file(marker, b"openrft\n")
        fs.rm_file(marker)
    except StorageError:
        raise
    except Exception as exc:
        raise StorageError(uri, f"outputs cannot be written there ({_describe(exc)})") from None


def holds_file(uri: str) -> bool:
    fs, path = _filesystem(uri)
    try:
        return fs.isfile(path)
    except Exception as exc:
        raise StorageError(uri, f"cannot be listed ({_describe(exc)})") from None


def upload_file(local: Path, uri: str) -> None:
    fs, path = _filesystem(uri)
    try:
        fs.put_file(str(local), path)
    except Exception as exc:
        raise StorageError(uri, f"upload of {local} failed ({_describe(exc)})") from None


def remove_tree(uri: str) -> None:
    """Remove every object under ``uri`` (a prefix); nothing there is not an error."""
    fs, path = _filesystem(uri)
    try:
        if fs.exists(path):
            fs.rm(path, recursive=True)
    except FileNotFoundError:
        return
    except Exception as exc:
        raise StorageError(uri, f"cannot be removed ({_describe(exc)})") from None
    fs.invalidate_cache()


def list_names(uri: str) -> set[str]:
    """Names of the entries directly under ``uri`` (a prefix or directory); none when nothing is there."""
    fs, path = _filesystem(uri)
    try:
        entries = fs.ls(path, detail=False, refresh=True)
    except FileNotFoundError:
        return set()
    except Exception as exc:
        raise StorageError(uri, f"cannot be listed ({_describe(exc)})") from None
    return {entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries}
