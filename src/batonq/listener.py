"""Wake-ups for long-poll claims: one LISTEN connection per client, shared
by all its waiters, never one per waiter.

The engine sends ``NOTIFY batonq, '<queue>'`` when a task becomes claimable
now (at most one per queue per transaction), while someone awaits the queue
(``batonq.await_work``): a watch given ``renew`` keeps that registration
current. A waiter that misses a wake-up (the listener was reconnecting)
still polls at its client's poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import psycopg

__all__ = ["CHANNEL", "AsyncListener", "AsyncNoListener", "AsyncWake", "Listener", "NoListener", "Wake"]

CHANNEL = "batonq"
_READY_TIMEOUT_S = 5.0
_RECONNECT_S = 1.0
log = logging.getLogger("batonq.listener")


class _Registry:
    """Which waiters want which queue; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[object]] = {}

    def add(self, queue: str, waiter: object) -> None:
        with self._lock:
            self._waiters.setdefault(queue, set()).add(waiter)

    def remove(self, queue: str, waiter: object) -> None:
        with self._lock:
            waiters = self._waiters.get(queue)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[queue]

    def of(self, queue: str | None) -> list[object]:
        """The waiters of one queue, or of every queue for None."""
        with self._lock:
            if queue is None:
                return [w for ws in self._waiters.values() for w in ws]
            return list(self._waiters.get(queue, ()))


AsyncRenew = Callable[[str, float], Awaitable[bool]]
"""``renew(queue, for_s)``: keep wake-ups for ``queue`` coming for ``for_s``
more seconds; True when it registered anew (look for work before sleeping)."""
Renew = Callable[[str, float], bool]


class AsyncWake:
    def __init__(self, event: asyncio.Event, queue: str = "", renew: AsyncRenew | None = None) -> None:
        self._event = event
        self._queue = queue
        self._renew = renew

    async def wait(self, timeout: float) -> bool:
        """Wait until the queue may have work, or ``timeout`` seconds."""
        if self._renew is not None and await self._renew(self._queue, timeout):
            return True  # registered anew: work may have come before it
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._event.clear()


class AsyncListener:
    """LISTEN on one asyncio connection, started on first use.

    ``on_connect`` runs each time it is listening again: a server that
    restarted (or failed over) has forgotten who awaited its queues."""

    def __init__(self, dsn: str, on_connect: Callable[[], None] | None = None) -> None:
        self._dsn = dsn
        self._on_connect = on_connect
        self._registry = _Registry()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    @contextlib.asynccontextmanager
    async def watch(self, queue: str, renew: AsyncRenew | None = None) -> AsyncIterator[AsyncWake]:
        """Wake-ups for ``queue``; with ``renew``, registered for them first
        (once listening) and kept registered by each ``wait``."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="batonq-listener")
        event = asyncio.Event()
        self._registry.add(queue, event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), _READY_TIMEOUT_S)
            if renew is not None:
                await renew(queue, 0.0)
            yield AsyncWake(event, queue, renew)
        finally:
            self._registry.remove(queue, event)

    def _wake(self, queue: str | None) -> None:
        for event in self._registry.of(queue):
            assert isinstance(event, asyncio.Event)
            event.set()

    async def _run(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    if self._on_connect is not None:
                        self._on_connect()
                    self._ready.set()
                    self._wake(None)  # anything may have happened while we were away
                    async for notify in conn.notifies():
                        self._wake(notify.payload)
            except psycopg.Error as error:
                self._ready.clear()
                log.warning("listener connection lost (%s); polling until it is back", error)
                await asyncio.sleep(_RECONNECT_S)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class AsyncNoListener:
    """Poll-only mode (e.g. behind a transaction-pooling PgBouncer)."""

    @contextlib.asynccontextmanager
    async def watch(self, queue: str, renew: AsyncRenew | None = None) -> AsyncIterator[AsyncWake]:
        yield AsyncWake(asyncio.Event())  # nothing would wake it: no registration

    async def close(self) -> None:
        return None


class Wake:
    def __init__(self, event: threading.Event, queue: str = "", renew: Renew | None = None) -> None:
        self._event = event
        self._queue = queue
        self._renew = renew

    def wait(self, timeout: float) -> bool:
        """Wait until the queue may have work, or ``timeout`` seconds."""
        if self._renew is not None and self._renew(self._queue, timeout):
            return True  # registered anew: work may have come before it
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken


class Listener:
    """LISTEN on one connection in a daemon thread, started on first use;
    ``on_connect`` as for ``AsyncListener``."""

    def __init__(self, dsn: str, on_connect: Callable[[], None] | None = None) -> None:
        self._dsn = dsn
        self._on_connect = on_connect
        self._registry = _Registry()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._ready = threading.Event()
        self._closed = threading.Event()

    @contextlib.contextmanager
    def watch(self, queue: str, renew: Renew | None = None) -> Iterator[Wake]:
        """Wake-ups for ``queue``; with ``renew``, registered for them first
        (once listening) and kept registered by each ``wait``."""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="batonq-listener", daemon=True)
                self._thread.start()
        event = threading.Event()
        self._registry.add(queue, event)
        try:
            self._ready.wait(_READY_TIMEOUT_S)
            if renew is not None:
                renew(queue, 0.0)
            yield Wake(event, queue, renew)
        finally:
            self._registry.remove(queue, event)

    def _wake(self, queue: str | None) -> None:
        for event in self._registry.of(queue):
            assert isinstance(event, threading.Event)
            event.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if self._on_connect is not None:
                        self._on_connect()
                    self._ready.set()
                    self._wake(None)
                    while not self._closed.is_set():
                        for notify in conn.notifies(timeout=0.5):
                            self._wake(notify.payload)
            except psycopg.Error as error:
                self._ready.clear()
                log.warning("listener connection lost (%s); polling until it is back", error)
                self._closed.wait(_RECONNECT_S)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class NoListener:
    """Poll-only mode (e.g. behind a transaction-pooling PgBouncer)."""

    @contextlib.contextmanager
    def watch(self, queue: str, renew: Renew | None = None) -> Iterator[Wake]:
        yield Wake(threading.Event())  # nothing would wake it: no registration

    def close(self) -> None:
        return None
