"""API keys on requests: Bearer keys with a ring and queue scopes."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request

from batonq.client import AsyncClient
from batonq.rings import RINGS, covers
from batonq.service.problems import ApiError
from batonq.service.state import client_of

__all__ = ["Principal", "authenticate", "require"]

_KEY = re.compile(r"bq_([0-9]{1,18})_([0-9a-f]{64})")
_NO_HASH = bytes(32)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: a key's id, ring and queue scopes."""

    key_id: int
    ring: int
    queues: tuple[str, ...]

    def covers(self, queue: str) -> bool:
        return covers(self.queues, queue)

    def check_queue(self, queue: str) -> None:
        """403 unless the key's scopes cover ``queue`` (whether it exists or not)."""
        if not self.covers(queue):
            raise ApiError(403, "forbidden", f"this key may not use queue {queue!r}")


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


async def authenticate(client: AsyncClient, header: str | None) -> Principal:
    scheme, _, key = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise _unauthorized("send an API key: Authorization: Bearer bq_…")
    match = _KEY.fullmatch(key.strip())
    if match is None:
        raise _unauthorized("invalid API key")
    auth = await client.key_for_auth(int(match[1]))
    presented = hashlib.sha256(match[2].encode()).digest()
    stored = auth.secret_hash if auth is not None else _NO_HASH
    # Compared in constant time, and compared even for unknown ids.
    if not hmac.compare_digest(presented, stored) or auth is None or auth.revoked:
        raise _unauthorized("invalid or revoked API key")
    return Principal(int(match[1]), auth.ring, tuple(auth.queues))


def require(ring: int) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency: the request's key, which must be of ``ring`` or stronger."""

    async def dependency(request: Request) -> Principal:
        principal = await authenticate(client_of(request), request.headers.get("authorization"))
        if principal.ring > ring:
            raise ApiError(
                403, "forbidden", f"this needs a key of ring {ring} ({RINGS[ring]}) or stronger"
            )
        request.state.principal = principal
        return principal

    return dependency
