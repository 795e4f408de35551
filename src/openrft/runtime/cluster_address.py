"""Whether a Ray cluster's address answers at all, checked before ``ray.init``: Ray's own client keeps retrying an
address that refuses connections for minutes, which would hang a job process (or the service's worker) with no
word of why."""

from __future__ import annotations

import socket
import time

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


CLIENT_ATTEMPTS = 3
CLIENT_RETRY_S = 2.0


def init_ray(address: str | None, attempts: int = CLIENT_ATTEMPTS, retry_s: float = CLIENT_RETRY_S, **kwargs) -> None:
    """``ray.init(address=address, **kwargs)``, tried up to ``attempts`` times for a Ray Client address
    (``ray://``): the head's client proxy starts a server process for every new connection, and on a loaded head
    that process can die while starting ("Starting Ray client server failed"), which a second try gets past. Any
    other address, and the last try's error, are Ray's own."""
    import ray

    tries = attempts if address and address.startswith("ray://") else 1
    for attempt in range(1, tries + 1):
        try:
            ray.init(address=address, **kwargs)
            return
        except ConnectionAbortedError:  # the proxy's "Initialization failure from server"
            if attempt == tries:
                raise
            time.sleep(retry_s * attempt)
