"""API keys: ``Authorization: Bearer KEY``; each key is its own tenant (owner of its files and jobs).

With no key configured, a server bound to loopback serves everyone as the tenant ``local``; the
serve command refuses to bind elsewhere without a key, and a non-loopback server whose keys were
all revoked refuses every request rather than opening up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from openrft.service.errors import ApiError
from openrft.service.store import Store

LOCAL_OWNER = "local"


class Authenticator:
    def __init__(self, store: Store, require_key: bool):
        self.store = store
        self.require_key = require_key

    def owner(self, authorization: str | None) -> str:
        token = None
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer" and value.strip():
                token = value.strip()
        if token:
            owner = self.store.owner_for_key(token)
            if owner is not None:
                return owner
        if not self.require_key and not self.store.any_keys():
            return LOCAL_OWNER
        if token:
            raise ApiError(401, "Incorrect API key provided", "invalid_api_key")
        raise ApiError(401, "Missing API key: send Authorization: Bearer YOUR_KEY", "missing_api_key")


class RecentOwners:
    """The tenant of each credential seen in the last ``ttl_s`` seconds, so that a client sending dozens of
    requests a second (the Tinker SDK's training loop: a sample request and its retrieve per prompt) does not
    query the store for each. A refused credential is never remembered; a revoked key is refused once its
    entry expires, at most ``ttl_s`` after the revocation."""

    def __init__(
        self, auth: Authenticator, ttl_s: float = 2.0, size: int = 1024, clock: Callable[[], float] = time.monotonic
    ):
        self.auth, self.ttl_s, self.size, self.clock = auth, ttl_s, size, clock
        self._seen: dict[str | None, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def cached(self, authorization: str | None) -> str | None:
        """The remembered tenant, or None when there is none fresh (then call ``owner``)."""
        entry = self._seen.get(authorization)
        if entry is None or self.clock() >= entry[1]:
            return None
        return entry[0]

    def owner(self, authorization: str | None) -> str:
        """As ``Authenticator.owner`` (store queries: call it off the event loop), remembered when accepted."""
        who = self.auth.owner(authorization)
        with self._lock:
            self._seen.pop(authorization, None)
            self._seen[authorization] = (who, self.clock() + self.ttl_s)
            while len(self._seen) > self.size:
                del self._seen[next(iter(self._seen))]
        return who


_bearer = HTTPBearer(auto_error=False, description="an OpenRFT API key (openrft keys create)")


def current_owner(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
    """FastAPI dependency: the tenant making this request (the scheme is declared for the OpenAPI document)."""
    authenticator: Authenticator = request.app.state.auth
    return authenticator.owner(request.headers.get("authorization"))
