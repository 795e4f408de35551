"""The Tinker API on the service's app: its state, the RestClient's routes, then the training and sampling
routes (their catch-all answers every other path, so they come last)."""

from __future__ import annotations

import logging

from openrft.service.tinker import rest
from openrft.service.tinker.routes import TinkerState, router
from openrft.service.tinker.settings import TinkerSettings

log = logging.getLogger("openrft.tinker")


def mount(app) -> None:
    """The Tinker routes on ``app``, next to the others (not in its OpenAPI document)."""
    config = app.state.config
    settings = getattr(config, "tinker", None) or TinkerSettings()
    quota_bytes = getattr(config, "max_stored_bytes_per_tenant", None)
    address = getattr(config, "ray_address", None)  # clients as Ray actors on the server's cluster (remote.py)
    app.state.tinker = TinkerState(config.data_dir, app.state.store, app.state.auth, settings, quota_bytes, address)
    resumable = app.state.tinker.records.orphaned()
    if resumable:
        log.info("Tinker training clients left by a stopped server, marked paused: %s", ", ".join(resumable))
    app.include_router(rest.downloads)
    app.include_router(rest.router)
    app.include_router(router)  # last: its catch-all answers every other path
