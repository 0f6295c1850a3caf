"""Who is calling a tool: a database client, a ring and queue scopes.

Over stdio the access is fixed when the server starts (full, ``--read-only``,
or a ``--key``'s ring and queues). Over streamable HTTP every request carries
a Bearer key; ``batonq.mcp.http`` checks it and puts the access in the
request's ASGI scope, where the tools find it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from batonq.client import AsyncClient
from batonq.rings import OBSERVER, RINGS, WORKER, covers
from batonq.service.auth import Principal
from batonq.service.limits import NewQueues
from batonq.service.problems import ApiError

__all__ = ["SCOPE_KEY", "Access", "access_of", "find_access"]

SCOPE_KEY = "batonq.mcp.access"
"""The ASGI scope key under which the HTTP mount passes the caller's access."""


@dataclass(frozen=True, slots=True)
class Access:
    client: AsyncClient
    ring: int = 0
    queues: tuple[str, ...] = ("*",)
    worker: str = "mcp"
    key: Principal | None = None
    """The API key, when the access comes from one (HTTP, or stdio with ``--key``)."""
    new_queues: NewQueues | None = None
    """Where the key's new queues are counted, as the service counts them."""

    @property
    def can_write(self) -> bool:
        """Rings 0-2 may enqueue, claim and submit; ring 3 only reads."""
        return self.ring <= WORKER

    def read_only(self) -> Access:
        return replace(self, ring=max(self.ring, OBSERVER))

    def covers(self, queue: str) -> bool:
        return covers(self.queues, queue)

    def check_queue(self, queue: str) -> None:
        if not self.covers(queue):
            raise ToolError(
                f"forbidden: this key may not use queue {queue!r} (it covers {', '.join(self.queues)})"
            )

    async def check_new_queue(self, queue: str) -> None:
        """A key may create only so many queues an hour (see ``NewQueues``)."""
        if self.key is None or self.new_queues is None:
            return
        try:
            await self.new_queues.check(self.key, [queue])
        except ApiError as error:
            wait_s = (error.headers or {}).get("Retry-After", "?")
            raise ToolError(f"{error.code}: {error.message} (retry in {wait_s} s)") from None

    def check_write(self, tool: str) -> None:
        if not self.can_write:
            raise ToolError(
                f"forbidden: {tool} writes, and this connection is read-only "
                f"(ring {self.ring}, {RINGS.get(self.ring, '?')}); it needs a key of ring 2 (worker) "
                "or stronger"
            )


def find_access(request_context: ServerRequestContext[Any, Any]) -> Access | None:
    """The caller's access: from the HTTP request if there is one, else the server's."""
    scope = getattr(request_context.request, "scope", None)
    if isinstance(scope, dict):
        found = scope.get(SCOPE_KEY)
        if isinstance(found, Access):
            return found
    if isinstance(request_context.lifespan_context, Access):
        return request_context.lifespan_context
    return None


def access_of(ctx: Context[Any, Any]) -> Access:
    access = find_access(ctx.request_context)
    if access is None:
        raise ToolError("unauthorized: no batonq access on this connection")
    return access
