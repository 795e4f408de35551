"""The web dashboard served by ``openrft serve`` at ``/``: the job list and a live page per job.

A static page (``static/``, with uPlot vendored: no CDN) that reads the JSON routes of ``routes`` and acts
through the OpenAI routes (cancel, pause, resume). Its data routes take the API key like every other
route; the page asks for the key when the server has keys and keeps it in the browser's session storage.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from openrft.service.dashboard.routes import router

STATIC_DIR = Path(__file__).parent / "static"
STATIC_URL = "/dashboard/static"


def mount(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="dashboard-static")
