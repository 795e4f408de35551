"""Which engine the Tinker routes get: clients in this process (``engine.Engine``, the default), or placed as
Ray actors on the server's cluster (``remote.RayEngine``) when ``openrft serve --ray-address`` names one. Both
answer the same methods, so the routes never ask which."""

from __future__ import annotations

from openrft.service.tinker.settings import TinkerSettings


def engine_for(sources: dict[str, str], settings: TinkerSettings, ray_address: str | None):
    if ray_address:
        from openrft.service.tinker.remote import RayEngine

        return RayEngine(sources, settings, ray_address)
    from openrft.service.tinker.engine import Engine

    return Engine(sources)
