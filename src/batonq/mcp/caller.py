"""Who is calling a tool: a database client, the caller's access (a key's
ring and queue scopes, see ``batonq.access``) and the worker name its claims
record.

Over stdio the caller is fixed when the server starts (full, ``--read-only``,
or a ``--key``'s ring and queues). Over streamable HTTP every request carries
a Bearer key; ``batonq.mcp.http`` checks it and puts the caller in the
request's ASGI scope, where the tools find it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from batonq.access import Access, NewQueues, OpenPerKey, Refused, admit, door
from batonq.client import AsyncClient
from batonq.rings import RINGS

__all__ = ["SCOPE_KEY", "Caller", "caller_of", "find_caller"]

SCOPE_KEY = "batonq.mcp.caller"
"""The ASGI scope key under which the HTTP mount passes the caller."""


@dataclass(frozen=True, slots=True)
class Caller:
    client: AsyncClient
    access: Access = field(default_factory=Access)
    worker: str = "mcp"
    new_queues: NewQueues | None = None
    """Where a key's new queues are counted (as the service counts them);
    None for an MCP server started without a key."""
    open_per_key: OpenPerKey | None = None
    """Where a key's waiting calls are counted, with the service's streams
    and long-poll claims; None for an MCP server started without a key."""

    def read_only(self) -> Caller:
        return replace(self, access=self.access.read_only())

    def _tool_error(self, refused: Refused) -> ToolError:
        if refused.code == "forbidden":
            return ToolError(f"forbidden: {refused.message} (it covers {', '.join(self.access.queues)})")
        return ToolError(f"{refused.code}: {refused.message}")

    def check_queue(self, queue: str) -> None:
        try:
            self.access.check_queue(queue)
        except Refused as refused:
            raise self._tool_error(refused) from None

    async def check_new_queue(self, queue: str) -> None:
        """A key may create only so many queues an hour (``NewQueues``)."""
        if self.new_queues is None:
            return
        try:
            await self.new_queues.check(self.access, [queue])
        except Refused as refused:
            wait_s = (refused.headers or {}).get("Retry-After", "?")
            raise ToolError(f"{refused.code}: {refused.message} (retry in {wait_s} s)") from None

    def check_token(self, lease_token: str) -> None:
        """The token must name a queue the caller's key covers."""
        try:
            self.access.check_token(lease_token)
        except Refused as refused:
            raise self._tool_error(refused) from None

    def admit(self, tool: str, action: object = None) -> None:
        """The gate (``batonq.access.admit``) for tool ``tool``, as declared
        in ``batonq.access.DOORS``."""
        name = f"mcp {tool}"
        try:
            admit(self.access, name, action)
        except Refused:
            declared = door(name)
            needed = declared.ring_for(action)
            assert needed is not None
            wanted = f"a key of ring {needed} ({RINGS[needed]}) or stronger"
            if declared.actions:
                raise ToolError(f"forbidden: {action} of a schedule needs {wanted}") from None
            raise ToolError(
                f"forbidden: {tool} writes, and this connection is read-only "
                f"(ring {self.access.ring}, {RINGS.get(self.access.ring, '?')}); it needs {wanted}"
            ) from None

    @contextlib.contextmanager
    def held_open(self, waits: bool) -> Iterator[None]:
        """Count a call that ``waits`` as one of the key's long-lived
        requests (``batonq.access.OpenPerKey``) while it runs."""
        if not waits or self.open_per_key is None:
            yield
            return
        try:
            release = self.open_per_key.hold(self.access.key_id)
        except Refused as refused:
            wait_s = (refused.headers or {}).get("Retry-After", "?")
            raise ToolError(f"{refused.code}: {refused.message} (retry in {wait_s} s)") from None
        try:
            yield
        finally:
            release()


def find_caller(request_context: ServerRequestContext[Any, Any]) -> Caller | None:
    """The caller: from the HTTP request if there is one, else the server's."""
    scope = getattr(request_context.request, "scope", None)
    if isinstance(scope, dict):
        found = scope.get(SCOPE_KEY)
        if isinstance(found, Caller):
            return found
    if isinstance(request_context.lifespan_context, Caller):
        return request_context.lifespan_context
    return None


def caller_of(ctx: Context[Any, Any]) -> Caller:
    caller = find_caller(ctx.request_context)
    if caller is None:
        raise ToolError("unauthorized: no batonq access on this connection")
    return caller
