"""The MCP server in the HTTP service: streamable HTTP at ``/mcp``.

Every request presents a Bearer key, checked like the /v1 API's; its ring and
queue scopes travel with the request to each tool call. The transport is
stateless (no MCP session kept in memory), so several ``batonq serve``
processes behind one address serve MCP as they serve /v1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from batonq.access import Refused, authenticate_from
from batonq.client import AsyncClient
from batonq.mcp.caller import SCOPE_KEY, Caller
from batonq.mcp.server import build_server
from batonq.schemas import ErrorBody, ErrorOut

__all__ = ["PATH", "mount"]

PATH = "/mcp"


class _Authenticated:
    """ASGI app: check the Bearer key, then hand the request to the MCP transport."""

    def __init__(self, app: FastAPI, manager: StreamableHTTPSessionManager) -> None:
        self.app, self.manager = app, manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client: AsyncClient = self.app.state.client
        try:
            address = scope["client"][0] if scope.get("client") else ""
            access = await authenticate_from(
                self.app.state.failed_auth, address, client, Headers(scope=scope).get("authorization")
            )
        except Refused as error:
            await _refuse(send, error)
            return
        state = self.app.state
        caller = Caller(client, access, f"mcp:key-{access.key_id}", state.new_queues, state.open_per_key)
        await self.manager.handle_request({**scope, SCOPE_KEY: caller}, receive, send)


async def _refuse(send: Send, error: Refused) -> None:
    content = ErrorOut(error=ErrorBody(code=error.code, message=error.message)).model_dump_json().encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def mount(app: FastAPI, path: str = PATH) -> None:
    """Serve MCP at ``path`` of ``app``, whose lifespan must put an
    ``AsyncClient`` on ``app.state.client``; the transport starts and stops
    with the app."""
    server = build_server()
    # Builds the transport's session manager (the Starlette app it returns is
    # not used: the route below serves the manager, behind the key check).
    server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        # Keys authenticate every request; the service's own --host decides
        # who may connect, so no Host header allow-list here.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager
    app.router.routes.append(
        Route(path, _Authenticated(app, manager), methods=["GET", "POST", "DELETE"], include_in_schema=False)
    )
    inner: Callable[[Any], AbstractAsyncContextManager[Any]] = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(started: Any) -> AsyncIterator[Any]:
        async with inner(started) as state, manager.run():
            yield state

    app.router.lifespan_context = lifespan
