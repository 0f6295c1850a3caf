"""Per-key bounds kept by each process: what a key holds open at once
(streams, long-poll claims). How many queues a key creates is counted in
``batonq.access.NewQueues`` (the MCP server counts them too)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from batonq.service.problems import ApiError

__all__ = ["DEFAULT_MAX_STREAMS_PER_KEY", "OpenPerKey"]

DEFAULT_MAX_STREAMS_PER_KEY = 100
RETRY_AFTER_S = 5


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
