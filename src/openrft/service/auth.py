"""API keys: ``Authorization: Bearer KEY``; each key is its own tenant (owner of its files and jobs).

With no key configured, a server bound to loopback serves everyone as the tenant ``local``; the
serve command refuses to bind elsewhere without a key, and a non-loopback server whose keys were
all revoked refuses every request rather than opening up.
"""

from __future__ import annotations

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


_bearer = HTTPBearer(auto_error=False, description="an OpenRFT API key (openrft keys create)")


def current_owner(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> str:
    """FastAPI dependency: the tenant making this request (the scheme is declared for the OpenAPI document)."""
    authenticator: Authenticator = request.app.state.auth
    return authenticator.owner(request.headers.get("authorization"))
