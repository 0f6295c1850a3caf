"""The HTTP API's ASGI app: ``create_app(dsn)``; ``batonq.server`` adds the
MCP server and the dashboard to it for ``batonq serve``.

It keeps no state that matters between requests (keys, leases and tasks are in
the database), so several processes against one database are one service.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batonq.access import (
    DEFAULT_MAX_STREAMS_PER_KEY,
    DEFAULT_NEW_QUEUES_PER_HOUR,
    FailedAuth,
    NewQueues,
    OpenPerKey,
)
from batonq.client import AsyncClient
from batonq.service import admin, discovery, problems, reads, schedules, stream, work
from batonq.service.auth import check_doors
from batonq.service.metrics import Metrics
from batonq.service.streams import PendingCounts, stop_on_signals
from batonq.version import VERSION

__all__ = ["create_app"]

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class Limits:
    """Refuse request bodies over ``max_body_bytes`` with 413 before they
    are parsed, read /v1 bodies as JSON, and time every request for /metrics.

    A declared Content-Length over the limit is refused before a byte of the
    body is read; a chunked body is read up to the limit, then refused. The
    body is read here whole and handed on, so the app never sees a part."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, metrics: Metrics) -> None:
        self.app, self.max_body_bytes, self.metrics = app, max_body_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def watched_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            scope = self._as_json(scope)
            body = await self._read_body(scope, receive)
            if body is None:
                await self._refuse(watched_send)
                return
            await self.app(scope, self._replay(body, receive), watched_send)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.latency.labels(scope["method"], route, str(status)).observe(
                time.perf_counter() - started
            )

    @staticmethod
    def _as_json(scope: Scope) -> Scope:
        """/v1 speaks JSON only: read a body as JSON whatever it is labelled
        (curl -d sends form encoding by default)."""
        if not scope["path"].startswith("/v1/"):
            return scope
        headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-type"]
        return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None when it is over the limit."""
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            return None
        if declared is None and b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
            return b""
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; the app will see it too
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    def _replay(body: bytes, receive: Receive) -> Receive:
        sent = False

        async def replayed() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: http.disconnect, when it comes

        return replayed

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            problems.body("request_too_large", f"request body over {self.max_body_bytes} bytes")
        ).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})


def create_app(
    dsn: str,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    keepalive_s: float = 15.0,
    max_streams_per_key: int = DEFAULT_MAX_STREAMS_PER_KEY,
    new_queues_per_hour: int = DEFAULT_NEW_QUEUES_PER_HOUR,
    sweeper: bool = True,
    client_options: dict[str, Any] | None = None,
    read_dsn: str | None = None,
) -> FastAPI:
    """The batonq HTTP service on the database at ``dsn``; with ``read_dsn``
    (a streaming replica) its listings and counts are read there."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # A burst larger than the pool waits up to 10 s for a connection;
        # while the database is unreachable a request waits at most 1 s,
        # then answers 503: callers retry instead of hanging.
        options: dict[str, Any] = {"max_connections": 20, "sweeper": sweeper, "connection_wait_s": 10.0}
        options.update(client_options or {})
        async with AsyncExitStack() as opened:
            client = await opened.enter_async_context(await AsyncClient(dsn, **options).open())
            app.state.client = client
            app.state.reader = client
            if read_dsn is not None:
                # Reads only: no LISTEN, no sweeper (a standby refuses both).
                reader = AsyncClient(read_dsn, **{**options, "listen": False, "sweeper": False})
                app.state.reader = await opened.enter_async_context(await reader.open())
            app.state.pending_counts = PendingCounts(client, reuse_s=keepalive_s)
            app.state.stopping = asyncio.Event()  # set on SIGTERM: event streams end
            opened.callback(stop_on_signals(app.state.stopping))
            app.state.new_queues = NewQueues(client, new_queues_per_hour)
            yield

    app = FastAPI(
        title="batonq",
        version=VERSION,
        summary="A task queue in PostgreSQL: leased, fenced, idempotent tasks.",
        lifespan=lifespan,
        docs_url=None,  # discovery.mount_docs: Swagger UI served from here, not a CDN
        redoc_url=None,
    )
    metrics = Metrics()
    app.state.metrics = metrics
    app.state.keepalive_s = keepalive_s
    app.state.open_per_key = OpenPerKey(max_streams_per_key)
    app.state.failed_auth = FailedAuth()
    problems.install(app)
    for module in (work, stream, reads, admin, schedules, discovery):
        app.include_router(module.router)
    discovery.mount_docs(app)
    app.add_middleware(Limits, max_body_bytes=max_body_bytes, metrics=metrics)
    check_doors(app)
    return app
