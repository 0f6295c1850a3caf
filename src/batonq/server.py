"""What ``batonq serve`` serves: the HTTP API at /v1, the MCP server at /mcp
and the dashboard at /ui, behind the same keys, in one ASGI app."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

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
    return app
