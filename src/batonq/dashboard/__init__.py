"""The dashboard: queues, tasks, dead letters, the graph and workers in a
browser, served by ``batonq serve`` at /ui. Server-rendered; its scripts
(htmx, uPlot) are vendored in ``static/vendor``."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from batonq.dashboard.views import NotSignedIn, router, to_login

__all__ = ["mount"]

STATIC = Path(__file__).with_name("static")


def mount(app: FastAPI) -> None:
    """Serve the dashboard at /ui, and send / there."""
    app.include_router(router)
    app.add_exception_handler(NotSignedIn, to_login)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui", status_code=307)
