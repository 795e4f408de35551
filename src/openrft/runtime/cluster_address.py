"""Whether a Ray cluster's address answers at all, checked before ``ray.init``: Ray's own client keeps retrying an
address that refuses connections for minutes, which would hang a job process (or the service's worker) with no
word of why."""

from __future__ import annotations

import socket

CONNECT_TIMEOUT_S = 5.0


def unreachable(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why ``address`` (``HOST:PORT`` of a head's GCS) cannot be reached, else None. ``auto``, ``ray://`` and
    None are left to Ray (``auto`` reads this machine's running cluster and fails at once without one)."""
    if not address or address == "auto" or "://" in address:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"nothing answers at {address} ({exc.strerror or exc.__class__.__name__})"
