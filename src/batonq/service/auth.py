"""API keys on requests: Bearer keys with a ring and queue scopes."""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request

from batonq.client import AsyncClient
from batonq.rings import RINGS, covers
from batonq.service.problems import ApiError
from batonq.service.state import client_of

__all__ = ["FailedAuth", "Principal", "authenticate", "authenticate_from", "require"]

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


class FailedAuth:
    """Failed authentications per client address, over a sliding window:
    an address with ``limit`` failures in the last ``window_s`` seconds gets
    429 for every request (whatever key it sends) until the oldest leaves the
    window. At most ``addresses`` addresses are tracked, the least recent
    dropped first, so a flood of sources cannot grow memory."""

    def __init__(self, limit: int = 100, window_s: float = 60.0, addresses: int = 10_000) -> None:
        self.limit, self.window_s, self.addresses = limit, window_s, addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float]:
        failures = self._failures.get(address, deque())
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures

    def check(self, address: str) -> None:
        """429 if ``address`` is over the limit."""
        now = time.monotonic()
        failures = self._recent(address, now)
        if len(failures) >= self.limit:
            retry_after = max(1, math.ceil(failures[-self.limit] + self.window_s - now))
            raise ApiError(429, "too_many_failures",
                           f"too many failed authentications from this address; try again in {retry_after} s",
                           headers={"Retry-After": str(retry_after)})  # fmt: skip

    def failed(self, address: str) -> None:
        failures = self._recent(address, time.monotonic())
        failures.append(time.monotonic())
        self._failures[address] = failures
        self._failures.move_to_end(address)
        while len(self._failures) > self.addresses:
            self._failures.popitem(last=False)


async def authenticate_from(
    failed: FailedAuth, address: str, client: AsyncClient, header: str | None
) -> Principal:
    """``authenticate``, under ``failed``'s limit for the client's ``address``."""
    failed.check(address)
    try:
        return await authenticate(client, header)
    except ApiError:
        failed.failed(address)
        raise


def require(ring: int) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency: the request's key, which must be of ``ring`` or stronger."""

    async def dependency(request: Request) -> Principal:
        address = request.client.host if request.client else ""
        principal = await authenticate_from(
            request.app.state.failed_auth, address, client_of(request), request.headers.get("authorization")
        )
        if principal.ring > ring:
            raise ApiError(
                403, "forbidden", f"this needs a key of ring {ring} ({RINGS[ring]}) or stronger"
            )
        request.state.principal = principal
        return principal

    return dependency
