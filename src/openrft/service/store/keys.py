"""API keys: stored as SHA-256 hashes; the secret is shown once, when created."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select, update

from openrft.service.store.base import Repo, new_id, now_s
from openrft.service.store.models import ApiKey

KEY_PREFIX = "ork-"


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class KeysRepo(Repo):
    def create_key(self, name: str) -> tuple[ApiKey, str]:
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        key = ApiKey(id=new_id("key_"), name=name, key_hash=hash_key(secret), prefix=secret[:10], created_at=now_s())
        with self.session() as s:
            s.add(key)
        return key, secret

    def owner_for_key(self, secret: str) -> str | None:
        """The tenant id (the key's id) of a live key, or None."""
        with self.session() as s:
            return s.scalar(select(ApiKey.id).where(ApiKey.key_hash == hash_key(secret), ApiKey.revoked_at.is_(None)))

    def key_name(self, key_id: str) -> str | None:
        """The name a key was created with (``openrft keys create --name``), or None."""
        with self.session() as s:
            return s.scalar(select(ApiKey.name).where(ApiKey.id == key_id))

    def any_keys(self) -> bool:
        with self.session() as s:
            return s.scalar(select(ApiKey.id).where(ApiKey.revoked_at.is_(None)).limit(1)) is not None

    def list_keys(self) -> list[ApiKey]:
        with self.session() as s:
            return list(s.scalars(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)))

    def revoke_key(self, key_id: str) -> bool:
        with self.session() as s:
            result = s.execute(
                update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=now_s())
            )
            return result.rowcount == 1
