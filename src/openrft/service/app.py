"""The FastAPI application: OpenAI fine-tuning routes, Vertex tuning-job routes, Nova recipes, one store."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

from openrft import __version__
from openrft.service import dashboard, routes_agents, routes_files, routes_nova, routes_openai, routes_vertex
from openrft.service.auth import Authenticator
from openrft.service.config import ServiceConfig
from openrft.service.errors import install_handlers
from openrft.service.graders import WorkPool
from openrft.service.internal_errors import InternalErrors
from openrft.service.limits import BodyLimit
from openrft.service.routes_quota import router as quota_router
from openrft.service.store import Store
from openrft.service.submission import Submitter

DESCRIPTION = """Reinforcement fine-tuning as a service. The OpenAI fine-tuning API (files, jobs, events,
checkpoints, graders), Vertex-style tuning jobs and Nova recipes share one job store; workers run the jobs."""


def create_app(config: ServiceConfig, store: Store | None = None) -> FastAPI:
    """The app; ``store`` None builds it for its OpenAPI document only."""
    app = FastAPI(title="OpenRFT", version=__version__, description=DESCRIPTION)
    app.state.config = config
    if store is not None:
        config.ensure_dirs()
        app.state.store = store
        app.state.auth = Authenticator(store, require_key=not config.loopback_only)
        app.state.submitter = Submitter(store, config)
        app.state.grader_pool = WorkPool(
            config.grader_workers,
            config.grader_queue_limit,
            "openrft-graders",
            tenant_workers=config.grader_workers_per_tenant,
            tenant_calls=config.grader_calls_per_tenant,
        )
    install_handlers(app)
    app.add_middleware(BodyLimit, max_request_bytes=config.max_request_bytes, max_upload_bytes=config.max_upload_bytes)
    app.add_middleware(InternalErrors)
    app.include_router(routes_files.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_agents.router)
    app.include_router(routes_nova.router)
    app.include_router(routes_vertex.build_router("v1"))
    app.include_router(routes_vertex.build_router("v1beta1", include_in_schema=False))
    app.include_router(quota_router)  # GET /v1/openrft/quota

    if store is not None:
        mount_tinker(app)
    dashboard.mount(app)  # the web dashboard at / (service/dashboard)

    @app.get("/health", tags=["openrft"])
    async def health() -> dict[str, Any]:  # on the event loop: answers while every request thread is busy
        return {"status": "ok", "version": __version__}

    return app


def mount_tinker(app: FastAPI) -> None:
    """The Tinker API (docs/tinker.md) when the ``tinker`` SDK is installed (its types read the bodies)."""
    try:
        from openrft.service.tinker.mount import mount
    except ImportError as exc:
        logging.getLogger("openrft.service").info("Tinker API off: %s (pip install 'openrft[tinker]')", exc)
        return
    mount(app)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document the server serves at ``/openapi.json`` (committed as docs/openapi.json)."""
    return create_app(ServiceConfig.build("/nonexistent-openrft-data", "sqlite://")).openapi()


if __name__ == "__main__":  # python -m openrft.service.app > docs/openapi.json
    import json

    print(json.dumps(openapi_document(), indent=2, sort_keys=True))
