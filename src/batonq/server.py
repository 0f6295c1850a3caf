"""What ``batonq serve`` serves: the HTTP API at /v1, the MCP server at /mcp
and the dashboard at /ui, behind the same keys, in one ASGI app."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.routing import Match

from batonq import tracing
from batonq.dashboard import mount as mount_dashboard
from batonq.mcp.http import mount as mount_mcp
from batonq.service import create_app
from batonq.service.auth import check_doors

__all__ = ["create_server"]


def create_server(dsn: str, **options: Any) -> FastAPI:
    """``batonq.service.create_app(dsn, **options)``, with MCP over
    streamable HTTP at /mcp and the dashboard at /ui (/ redirects there)."""
    app = create_app(dsn, **options)
    mount_mcp(app)
    mount_dashboard(app)
    check_doors(app)  # every route declared in batonq.access.DOORS
    traced = tracing.asgi_middleware()
    if traced is not None:
        app.add_middleware(traced, default_span_details=lambda scope: _span_details(app, scope))
    return app


def _span_details(app: FastAPI, scope: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An HTTP server span's name: the method and the route's template
    (``POST /v1/queues/{queue}/tasks``), not the path with its ids in it."""
    method = scope.get("method", "HTTP")
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            template = getattr(route, "path", scope.get("path", ""))
            return f"{method} {template}", {"http.route": template}
    return method, {}
