"""Per-key bounds kept by each process: what a key holds open at once
(streams, long-poll claims) and how many queues it creates."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable

from batonq.client import AsyncClient
from batonq.rings import OPERATOR
from batonq.service.auth import Principal
from batonq.service.problems import ApiError

__all__ = ["DEFAULT_MAX_STREAMS_PER_KEY", "DEFAULT_NEW_QUEUES_PER_HOUR", "NewQueues", "OpenPerKey"]

DEFAULT_MAX_STREAMS_PER_KEY = 100
DEFAULT_NEW_QUEUES_PER_HOUR = 100
RETRY_AFTER_S = 5
_HOUR_S = 3600.0
_REFRESH_S = 1.0


class OpenPerKey:
    """At most ``limit`` streams and long-poll claims open at once per key,
    in this process; one more is refused with 429 and Retry-After."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[int] = Counter()

    def hold(self, key_id: int) -> Callable[[], None]:
        """Count one more open for ``key_id``; call what it returns (once or
        more) when it closes."""
        if self._open[key_id] >= self.limit:
            raise ApiError(
                429, "too_many_streams",
                f"this key has {self.limit} streams and long-poll claims open, the most it may: "
                "close one, or retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )  # fmt: skip
        self._open[key_id] += 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._open[key_id] -= 1
                if self._open[key_id] <= 0:
                    del self._open[key_id]

        return release


class NewQueues:
    """At most ``per_hour`` new queues per key and hour, in this process, for
    keys weaker than ring 1 (an enqueue creates its queue). Past it: 429 with
    Retry-After. Which queues exist is read again at most every second."""

    def __init__(self, client: AsyncClient, per_hour: int) -> None:
        self._client, self.per_hour = client, per_hour
        self._known: set[str] = set()
        self._read_at = -math.inf
        self._reading = asyncio.Lock()
        self._made: dict[int, deque[float]] = {}  # key id -> time.monotonic() of each queue it made

    async def check(self, principal: Principal, queues: Iterable[str]) -> None:
        """Refuse, or count, the queues among ``queues`` that do not exist
        yet, for ``principal`` (the key of an HTTP or MCP request)."""
        if principal.ring <= OPERATOR:
            return
        new = set(queues) - self._known
        if not new:
            return
        async with self._reading:
            if time.monotonic() - self._read_at >= _REFRESH_S:
                self._known = {q.name for q in await self._client.queue_configs()}
                self._read_at = time.monotonic()
        new -= self._known
        if not new:
            return
        now = time.monotonic()
        made = self._made.setdefault(principal.key_id, deque())
        while made and made[0] <= now - _HOUR_S:
            made.popleft()
        if len(made) + len(new) > self.per_hour:
            wait_s = math.ceil(made[0] + _HOUR_S - now) if made else math.ceil(_HOUR_S)
            raise ApiError(
                429, "too_many_new_queues",
                f"this key may create {self.per_hour} queues an hour, and has made {len(made)}: "
                "use existing queues, or ask an operator to create these",
                headers={"Retry-After": str(wait_s)},
            )  # fmt: skip
        made.extend([now] * len(new))
        self._known |= new
