"""The MCP server object and the stdio entry point."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.prompts.base import Prompt
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, CallToolResult, ErrorData, JSONRPCError
from pydantic import ValidationError

from batonq.access import (
    DEFAULT_MAX_STREAMS_PER_KEY,
    DEFAULT_NEW_QUEUES_PER_HOUR,
    NewQueues,
    OpenPerKey,
    Refused,
    authenticate,
    undeclared,
)
from batonq.client import AsyncClient
from batonq.mcp.arguments import StrictTool
from batonq.mcp.caller import Caller, find_caller
from batonq.mcp.guide import GUIDE, GUIDE_URI, INSTRUCTIONS, work_through_queue
from batonq.mcp.tasks import Tasks
from batonq.mcp.tools import READ_TOOLS, TOOLS
from batonq.schemas import TaskOut
from batonq.version import VERSION

__all__ = ["build_server", "serve_stdio"]


async def _hide_write_tools(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """A read-only caller (ring 3 key, or --read-only) is shown only the reading
    tools; the write tools also refuse it themselves, should it call one anyway."""
    result = await call_next(ctx)
    if ctx.method == "tools/list" and isinstance(result, dict):
        caller = find_caller(ctx)
        if caller is None or not caller.access.can_write:
            tools = [
                t for t in result.get("tools", []) if isinstance(t, dict) and t.get("name") in READ_TOOLS
            ]
            result = {**result, "tools": tools}
    return result


@contextlib.contextmanager
def _root_logging_untouched() -> Iterator[None]:
    """MCPServer() calls logging.basicConfig; a library must leave the root
    logger to the application (uvicorn's, the test runner's), so give
    basicConfig a handler to find meanwhile, which makes it do nothing."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeHandler(placeholder)


def build_server(fixed: Caller | None = None) -> MCPServer[Any]:
    """batonq's MCP server. ``fixed``: every call's caller (stdio); without
    it, each HTTP request brings its own (see ``batonq.mcp.http``)."""
    lifespan = None
    if fixed is not None:

        @asynccontextmanager
        async def lifespan(_: MCPServer[Any]) -> AsyncIterator[Caller]:
            yield fixed

    missing = undeclared(f"mcp {name}" for name in TOOLS)
    if missing:
        raise RuntimeError(f"MCP tools not declared in batonq.access.DOORS: {missing}")
    tools = {
        name: StrictTool.strict(
            spec.fn,
            name=name,
            title=spec.title,
            description=spec.description,
            annotations=spec.annotations,
            structured_output=True,
        )
        for name, spec in TOOLS.items()
    }

    def run_answer(task: TaskOut) -> CallToolResult:
        """batonq_run's answer for a task, as its plain call gives it."""
        answer = tools["batonq_run"].fn_metadata.convert_result(task)
        assert isinstance(answer, CallToolResult)
        return answer

    with _root_logging_untouched():
        server: MCPServer[Any] = MCPServer(
            "batonq",
            title="batonq task queue",
            description="Claim tasks under leases, complete them with results, enqueue new ones.",
            instructions=INSTRUCTIONS,
            version=VERSION,
            lifespan=lifespan,
            middleware=[_hide_write_tools],
            tools=list(tools.values()),
            extensions=[Tasks("batonq_run", run_answer)],
        )

    @server.resource(
        GUIDE_URI,
        name="guide",
        title="batonq guide: claims, leases and submits",
        description="How to claim, hold and finish tasks; read it before working a queue.",
        mime_type="text/markdown",
    )
    def guide() -> str:
        return GUIDE

    server.add_prompt(
        Prompt.from_function(work_through_queue, name="work_through_queue", title="Work through queue Q")
    )
    return server


def _worker_name(key_id: int | None) -> str:
    who = f"key-{key_id}@" if key_id is not None else ""
    return f"mcp:{who}{socket.gethostname()}:{os.getpid()}"


async def stdio_access(client: AsyncClient, *, read_only: bool, key: str | None) -> Caller:
    """Full access, or a key's ring and queues; ``read_only`` caps it at ring 3.

    Raises ``PermissionError`` for an invalid or revoked key.
    """
    if key is None:
        caller = Caller(client, worker=_worker_name(None))
    else:
        try:
            access = await authenticate(client, f"Bearer {key}")
        except Refused as error:
            raise PermissionError(error.message) from None
        new_queues = NewQueues(client, DEFAULT_NEW_QUEUES_PER_HOUR)  # as `batonq serve` counts them
        waiting = OpenPerKey(DEFAULT_MAX_STREAMS_PER_KEY)  # as `batonq serve` counts them
        caller = Caller(client, access, _worker_name(access.key_id), new_queues, waiting)
    return caller.read_only() if read_only else caller


class _AnsweringUnreadable:
    """The stdin side of ``stdio_server``, where each line that is not a
    JSON-RPC message (the SDK passes it on as an exception, which would be
    dropped without a word) is answered with a JSON-RPC error instead: -32700
    for text that is not JSON, -32600 for JSON that is no message. The
    server reads on."""

    def __init__(self, inner: Any, outbound: Any) -> None:
        self._inner, self._outbound = inner, outbound

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage:
        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                return cast(SessionMessage, item)
            await self._outbound.send(SessionMessage(_refusal(item)))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _AnsweringUnreadable:
        return self

    async def __anext__(self) -> SessionMessage:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _AnsweringUnreadable:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


def _refusal(error: Exception) -> JSONRPCError:
    not_json = isinstance(error, ValidationError) and any(e["type"] == "json_invalid" for e in error.errors())
    if not_json:
        data = ErrorData(code=PARSE_ERROR, message="Parse error: the line is not JSON")
    else:
        data = ErrorData(code=INVALID_REQUEST, message="Invalid Request: the line is not a JSON-RPC message")
    return JSONRPCError(jsonrpc="2.0", id=None, error=data)


async def serve_stdio(dsn: str, *, read_only: bool = False, key: str | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes them."""
    async with await AsyncClient(dsn, max_connections=5).open() as client:
        caller = await stdio_access(client, read_only=read_only, key=key)
        lowlevel = build_server(caller)._lowlevel_server  # run_stdio_async, with unreadable lines answered
        async with stdio_server() as (read_stream, write_stream):
            inbound = _AnsweringUnreadable(read_stream, write_stream)
            await lowlevel.run(inbound, write_stream, lowlevel.create_initialization_options())
