"""Event streams: a response that says when it ends and ends when the
process is told to stop, and one count of a queue shared by every announce
stream of the process woken for it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from batonq.client import AsyncClient

__all__ = ["HeldStream", "PendingCounts", "stop_on_signals"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(stopping: asyncio.Event) -> Callable[[], None]:
    """Set ``stopping`` on SIGTERM or SIGINT, then hand the signal on to the
    handler it had (the HTTP server's); returns how to undo this.

    The server waits for open responses to end before it stops, and an
    event stream never ends by itself: told here, the streams end first."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signals reach the main thread only (an app run inside tests)
    loop = asyncio.get_running_loop()
    previous = {int(sig): signal.getsignal(sig) or signal.SIG_DFL for sig in _STOP_SIGNALS}

    def handle(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(stopping.set)
        handler = previous[sig]
        if callable(handler):
            handler(sig, frame)
        else:  # the default action (or none): as if this handler had not been here
            signal.signal(sig, handler)
            signal.raise_signal(sig)

    for sig in _STOP_SIGNALS:
        signal.signal(sig, handle)

    def undo() -> None:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is handle:
                signal.signal(sig, handler)

    return undo


async def _until(stopping: asyncio.Event, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events`` until ``stopping`` is set: then the stream ends as any
    response does (the client reads its end, not a broken connection)."""
    stop = asyncio.ensure_future(stopping.wait())
    step: asyncio.Future[str] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(events))
            await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                await asyncio.wait({step})
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        stop.cancel()
        # Cancelled from outside (the client went away): the step in flight
        # goes too, and the stream ends (its slot freed) only once it is
        # gone. Left running, a claim in it would lease a task for a
        # connection that is gone: an attempt spent, a lease to wait out.
        # Shielded: the server's cancel scope would cancel this wait too. Asked
        # again until it ends: a cancel that lands as a wait inside the step
        # times out is lost (asyncio.wait_for before Python 3.12).
        with anyio.CancelScope(shield=True):
            while step is not None and not step.done():
                step.cancel()
                await asyncio.wait({step}, timeout=0.1)


class HeldStream(StreamingResponse):
    """A streaming response that ends when ``stopping`` is set, and calls
    ``release`` when it ends, however it ends (the client went away, the
    server stops)."""

    def __init__(
        self,
        content: AsyncIterator[str],
        release: Callable[[], None],
        stopping: asyncio.Event,
        **options: Any,
    ) -> None:
        super().__init__(_until(stopping, content), **options)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


class PendingCounts:
    """Claimable-task counts for announce streams, per process. A queue is
    counted by one query at a time however many streams watch it: every
    stream woken for it shares the next count (one that starts after it
    asked, so it sees every task whose wake-up the stream had), and a
    stream that only timed out takes a count under ``reuse_s`` old."""

    def __init__(self, client: AsyncClient, reuse_s: float) -> None:
        self._client, self._reuse_s = client, reuse_s
        self._queues: dict[str, _QueueCount] = {}

    @contextlib.contextmanager
    def watching(self, queue: str) -> Iterator[_QueueCount]:
        """The counts of ``queue``, kept while some stream watches it."""
        count = self._queues.get(queue)
        if count is None:
            count = self._queues[queue] = _QueueCount(self._client, queue, self._reuse_s)
        count.watchers += 1
        try:
            yield count
        finally:
            count.watchers -= 1
            if count.watchers == 0:
                del self._queues[queue]


class _QueueCount:
    def __init__(self, client: AsyncClient, queue: str, reuse_s: float) -> None:
        self._client, self._queue, self._reuse_s = client, queue, reuse_s
        self.watchers = 0
        self._next: asyncio.Task[int] | None = None  # the count not started yet
        self._newest: asyncio.Task[int] | None = None
        self._known: tuple[float, int] | None = None  # (time.monotonic() a count started, its value)

    async def pending(self, *, fresh: bool) -> int:
        """Claimable tasks: counted from now on when ``fresh``, else maybe a
        little earlier."""
        if not fresh and self._known is not None and time.monotonic() - self._known[0] < self._reuse_s:
            return self._known[1]
        if self._next is None:
            self._next = self._newest = asyncio.create_task(self._count(self._newest))
        # Shielded: a stream that leaves does not cancel the others' count.
        return await asyncio.shield(self._next)

    async def _count(self, previous: asyncio.Task[int] | None) -> int:
        try:
            if previous is not None:
                await asyncio.wait([previous])  # one count of a queue at a time
        finally:
            self._next = None  # from here on, a stream that asks waits for the next count
        started = time.monotonic()
        stats = await self._client.queues(self._queue)
        # A paused queue has nothing claimable: announcing its tasks would
        # send subscribers to claims that get nothing (resume wakes them).
        pending = stats[0].pending if stats and not stats[0].paused else 0
        self._known = (started, pending)
        return pending
