"""API keys on requests: the dependency that checks a request's Bearer key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request

from batonq.access import Access, authenticate_from
from batonq.service.state import client_of

__all__ = ["require"]


def require(ring: int) -> Callable[[Request], Awaitable[Access]]:
    """A dependency: the request's key, which must be of ``ring`` or stronger."""

    async def dependency(request: Request) -> Access:
        address = request.client.host if request.client else ""
        access = await authenticate_from(
            request.app.state.failed_auth, address, client_of(request), request.headers.get("authorization")
        )
        access.check_ring(ring)
        return access

    return dependency
