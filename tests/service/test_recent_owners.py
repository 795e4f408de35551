"""The Tinker routes' cache of who a key belongs to (service/auth.py RecentOwners): fresh entries answer
without the store, a revoked key is refused once its entry expires, a refused key is never remembered."""

from __future__ import annotations

import pytest

from openrft.service.auth import Authenticator, RecentOwners
from openrft.service.errors import ApiError
from openrft.service.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_owners_are_remembered_for_their_ttl_and_revocation_then_holds(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'openrft.db'}")
    key, secret = store.create_key("a")
    clock = Clock()
    owners = RecentOwners(Authenticator(store, require_key=True), ttl_s=2.0, clock=clock)
    credential = f"Bearer {secret}"
    assert owners.cached(credential) is None
    assert owners.owner(credential) == key.id
    assert owners.cached(credential) == key.id
    store.revoke_key(key.id)
    clock.now += 1.9
    assert owners.cached(credential) == key.id  # within the TTL: not asked again
    clock.now += 0.2
    assert owners.cached(credential) is None
    with pytest.raises(ApiError) as refused:
        owners.owner(credential)
    assert refused.value.status == 401
    assert owners.cached(credential) is None  # a refusal is not remembered
    store.close()


def test_the_cache_is_bounded(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'openrft.db'}")
    secrets = [store.create_key(str(i))[1] for i in range(5)]
    owners = RecentOwners(Authenticator(store, require_key=True), size=3)
    for secret in secrets:
        owners.owner(f"Bearer {secret}")
    assert [owners.cached(f"Bearer {s}") is not None for s in secrets] == [False, False, True, True, True]
    store.close()
