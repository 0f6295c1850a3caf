"""AsyncClient: one method per engine operation.

``client_sync.py`` is generated from this file by ``scripts/generate_sync.py``
(a test checks that it is current): edit here, then run the script.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import socket
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from batonq import operations, tracing
from batonq.embedded import resolve_dsn
from batonq.errors import DirectConnectionNeeded, from_database_error
from batonq.json_values import load_json
from batonq.limits import MAX_AWAIT_S
from batonq.listener import AsyncListener, AsyncNoListener, AsyncWake
from batonq.models import (
    JSON,
    MISSING,
    ApiKey,
    AuditEntry,
    Edge,
    Enqueued,
    KeyAuth,
    Lease,
    NewKey,
    QueueConfig,
    QueueStats,
    RunStatus,
    Schedule,
    ScheduleFiring,
    Scorecard,
    SessionAuth,
    SetAsideWrite,
    Submitted,
    Task,
    Throughput,
)
from batonq.operations import Call
from batonq.sweeper import Sweeper

__all__ = ["ENV_LISTEN_DSN", "AsyncClient", "connect_async", "transaction_pooled"]

ENV_LISTEN_DSN = "BATONQ_LISTEN_URL"

T = TypeVar("T")

# A registration for wake-ups (await_work) lasts this long, or twice the wait
# it is for (at most the engine's hour); it is renewed when less than the
# coming wait and this margin is left. Short, so that enqueues stop notifying
# soon after every waiter got busy, yet an idle worker (claiming every 5 s)
# renews only every other time.
_AWAIT_S = 15.0
_AWAIT_MARGIN_S = 1.0
_PREPARE_THRESHOLD = 5  # psycopg's default: a statement run this often is prepared
_POOLER_PROBES = 3
_PROBE_TRIES = 5  # a probe's connection lost, it is asked again (0.1 to 0.8 s apart)
_RECONNECT_S = 0.5
_UNREACHABLE_WAIT_S = 1.0
"""How long a call waits for a connection while the database is unreachable."""
"""How long the pool retries a lost connection before it gives the attempt
up. psycopg_pool retries with a backoff that doubles from 1 s: kept for
minutes, its next attempt could come many seconds after the database is
back. Given up this soon, a new attempt starts at once while calls wait for
a connection (``_connect_again``), so the pool is back within about this
long of the database."""


# JSON read back through batonq.json_values.load_json: a stored row never
# fails to load.
_ADAPTERS = AdaptersMap(psycopg.adapters)
set_json_loads(load_json, _ADAPTERS)


def _heard_while_idle(conn: psycopg.BaseConnection[Any]) -> bool:
    """Whether anything arrived on ``conn`` while it sat idle in the pool.
    Nothing should: what does is most likely the server's goodbye (it
    restarted, failed over or ended the session). A look at the socket,
    no round trip."""
    fd = conn.pgconn.socket
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # Windows: no poll


async def transaction_pooled(dsn: str) -> bool:
    """Whether ``dsn`` goes through a transaction pooler: a server session
    that serves one connection also serves another between its
    transactions. Two connections ask which server process answers them,
    in turn, a few times (PgBouncer hands out the server connection last
    given back first, so the other connection gets it at once)."""
    connect = psycopg.AsyncConnection.connect
    async with (
        await connect(dsn, autocommit=True, prepare_threshold=None) as one,
        await connect(dsn, autocommit=True, prepare_threshold=None) as other,
    ):
        for _ in range(_POOLER_PROBES):
            first = await _server_pid(one)
            theirs = await _server_pid(other)
            again = await _server_pid(one)
            if again != first or theirs in (first, again):
                return True
    return False


async def _probed_pooled(dsn: str) -> bool:
    """``transaction_pooled``, asked again when a probe's connection is lost
    (a backend terminated, the server restarting): the pool has connected,
    so the server is there, and a worker must ride such faults out."""
    for attempt in range(_PROBE_TRIES - 1):
        try:
            return await transaction_pooled(dsn)
        except psycopg.OperationalError:
            await asyncio.sleep(0.1 * 2**attempt)  # sync: time.sleep(0.1 * 2**attempt)
    return await transaction_pooled(dsn)


async def _server_pid(conn: psycopg.AsyncConnection[Any]) -> int:
    cursor = await conn.execute("SELECT pg_backend_pid()")
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


def _default_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class AsyncClient:
    """A batonq client over a pool of connections.

    Usage: ``async with await batonq.connect_async() as client: ...``

    - ``listen``: wake long-poll claims with LISTEN/NOTIFY (one connection);
      False polls every ``poll_interval_s`` instead.
    - ``listen_dsn`` (default ``$BATONQ_LISTEN_URL``, else ``dsn``): where
      the LISTEN connection goes, the one that needs a session of its own.
      Behind a transaction pooler give ``dsn`` the pooler and ``listen_dsn``
      PostgreSQL itself (or a session-mode pooler).
    - ``pooled``: whether ``dsn`` goes through a transaction pooler
      (PgBouncer, Supavisor... in transaction mode), which hands a server
      session to other clients between transactions. None (default): True
      when ``listen_dsn`` differs from ``dsn``, else found out at open
      (``transaction_pooled``). Pooled, nothing relies on session state:
      no prepared statements, and ``listen`` without a ``listen_dsn`` of its
      own raises ``DirectConnectionNeeded`` at open.
    - ``prepare``: server-side prepared statements for repeated calls; by
      default on unless ``pooled``.
    - ``sweeper``: run a sweeper in this process (one leads at a time, by a
      lease in the database: it works through a pooler too).
    - ``connection_wait_s``: how long a call waits for a pooled connection
      while every connection is busy before it fails with
      ``psycopg_pool.PoolTimeout``. While the database is unreachable (the
      pool's last attempt to connect failed) a call fails after at most
      ``_UNREACHABLE_WAIT_S`` instead, so callers hear at once that it is down.
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_connections: int = 1,
        max_connections: int = 10,
        listen: bool = True,
        poll_interval_s: float = 1.0,
        listen_dsn: str | None = None,
        pooled: bool | None = None,
        prepare: bool | None = None,
        sweeper: bool = False,
        worker_name: str | None = None,
        connection_wait_s: float = 30.0,
    ) -> None:
        self.dsn = dsn
        self.listen_dsn = listen_dsn or os.environ.get(ENV_LISTEN_DSN) or dsn
        self.pooled = pooled if pooled is not None else (True if self.listen_dsn != dsn else None)
        self._prepare = prepare
        self._prepare_threshold: int | None = None  # decided at open, once pooled is known
        self._listen = listen
        self.worker_name = worker_name or _default_worker()
        self.poll_interval_s = poll_interval_s
        self.connection_wait_s = connection_wait_s
        self._unreachable = False  # the pool's last attempt to connect failed
        self._looked_empty: dict[str, float] = {}  # queue -> time.monotonic() a claim found nothing
        self._pool = AsyncConnectionPool(
            dsn,
            min_size=min_connections,
            max_size=max_connections,
            kwargs={"autocommit": True, "prepare_threshold": None, "context": _ADAPTERS},
            timeout=connection_wait_s,
            reconnect_timeout=_RECONNECT_S,
            reconnect_failed=self._connect_again,
            configure=self._connected,
            open=False,
        )
        self._awaited: dict[str, float] = {}  # queue -> time.monotonic() its registration ends
        self._listener = AsyncListener(self.listen_dsn, self.forget_awaited) if listen else AsyncNoListener()
        # The sweeper keeps no session state: through the pooler or not, the
        # same; given a URL straight to PostgreSQL it uses that, so a long
        # VACUUM holds none of the pooler's few server connections.
        self._sweeper = Sweeper(self.listen_dsn) if sweeper else None

    async def _connected(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The pool made a connection: the database is reachable."""
        self._unreachable = False

    async def _connect_again(self, pool: AsyncConnectionPool[Any]) -> None:
        """The pool gave a connection attempt up (after ``_RECONNECT_S``):
        the database is unreachable until a connection is made again. Start
        another attempt now if calls wait for a connection (``check`` grows
        the pool when it has none to give)."""
        self._unreachable = True
        if pool.get_stats().get("requests_waiting", 0):
            await pool.check()

    async def open(self) -> AsyncClient:
        await self._pool.open(wait=True)
        try:
            if self.pooled is None:
                self.pooled = await _probed_pooled(self.dsn)
            if self._listen:
                self.session_dsn()  # a setup that cannot listen fails now, not at a long-poll
        except BaseException:
            await self._pool.close()
            raise
        prepare = not self.pooled if self._prepare is None else self._prepare
        self._prepare_threshold = _PREPARE_THRESHOLD if prepare else None
        if self._sweeper is not None:
            self._sweeper.start()
        return self

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.stop()
        await self._listener.close()
        await self._pool.close()

    def session_dsn(self) -> str:
        """Where a connection that keeps session state (LISTEN) goes:
        ``listen_dsn``. Raises ``DirectConnectionNeeded`` when that is a
        transaction pooler (no URL straight to PostgreSQL was given)."""
        if self.pooled and self.listen_dsn == self.dsn:
            raise DirectConnectionNeeded(
                "the database URL goes through a transaction pooler, where LISTEN has no session of its"
                f" own: set ${ENV_LISTEN_DSN} (listen_dsn=) to PostgreSQL itself, or poll only"
                " (listen=False; batonq worker --no-listen)"
            )
        return self.listen_dsn

    @property
    def swept(self) -> int:
        """Leases this process's sweeper has expired (0 without a sweeper)."""
        return self._sweeper.swept if self._sweeper is not None else 0

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection inside a transaction, committed on success.

        Pass it as ``conn=`` to enqueue atomically with your own writes.
        """
        async with self._connection() as conn, conn.transaction():
            yield conn

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection from the pool that the server has not closed.

        A server that restarted or failed over closed every connection the
        pool holds. The first one taken is seen to be closed before anything
        is sent on it (so nothing can have run twice); then the pool checks
        all of its idle connections (a round trip each), replacing the
        closed ones, and the call goes on with a fresh one instead of
        failing."""
        async with self._pooled_connection() as conn:
            if not _heard_while_idle(conn):
                yield conn
                return
        await self._pool.check()
        async with self._pooled_connection() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _pooled_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The pool's ``connection()``, waiting a slice at a time: a busy
        pool makes a call wait up to ``connection_wait_s``; a database seen
        unreachable makes it fail within ``_UNREACHABLE_WAIT_S``, even one
        that began to wait before the database went away."""
        conn = await self._getconn()
        conn.prepare_threshold = self._prepare_threshold
        try:
            async with conn:
                yield conn
        finally:
            await self._pool.putconn(conn)

    async def _getconn(self) -> psycopg.AsyncConnection[Any]:
        deadline = time.monotonic() + self.connection_wait_s
        while True:
            wait = max(min(_UNREACHABLE_WAIT_S, deadline - time.monotonic()), 0.0)
            try:
                return await self._pool.getconn(wait)
            except PoolTimeout:
                if self._unreachable or time.monotonic() >= deadline:
                    raise

    async def _run(self, call: Call[T], conn: psycopg.AsyncConnection[Any] | None = None) -> T:
        try:
            if conn is not None:
                cursor = await conn.execute(call.sql, call.params)
                rows = await cursor.fetchall()
            else:
                # The async client shields the round trip: when the caller is
                # cancelled (an HTTP client gone, a worker stopping) the call
                # still runs to its end and its connection goes back to the
                # pool clean. Interrupted, psycopg would send a cancel request,
                # and one that arrives late cancels the connection's next
                # query: another caller's.
                rows = await asyncio.shield(self._pooled(call))  # sync: rows = self._pooled(call)
        except psycopg.Error as error:
            raise from_database_error(error) from error
        # Parsed after the transaction ended: a refused write raises LeaseLost
        # only once its record in the submit ledger is committed.
        return call.parse(rows)

    async def _pooled(self, call: Call[T]) -> operations.Rows:
        """One round trip on a connection from the pool."""
        async with self._connection() as pooled:
            cursor = await pooled.execute(call.sql, call.params)
            return await cursor.fetchall()

    async def enqueue(
        self,
        queue: str,
        payload: JSON,
        *,
        priority: int = 0,
        delay_s: float = 0.0,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        held: bool = False,
        parent: int | str | None = None,
        debounce_key: str | None = None,
        debounce_s: float | None = None,
        max_wait_s: float | None = None,
        keep: str = "last",
        group: str | None = None,
        dedupe_key: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> Enqueued:
        """Enqueue one task; with ``idempotency_key``, at most one task per
        key and queue. ``parent`` (``5521`` or ``"t_5521"``) links the lineage.

        Debounce: enqueues with the same ``debounce_key`` less than
        ``debounce_s`` apart collapse into one task (``created`` false for
        all but the first), claimable ``debounce_s`` after the last of them,
        or ``max_wait_s`` after the first; it carries the ``keep="last"``
        payload, or the ``"first"``.

        ``group`` (1-128 characters, e.g. a customer id) counts the task
        against its queue's ``group_max_leased`` and ``group_rate_limit``.

        ``dedupe_key``: an idempotency key held only while its task is
        unfinished; once that task is done, dead or cancelled, the same key
        enqueues a new task.

        ``conn`` joins your transaction: the task exists only if it commits.
        """
        with tracing.send(queue, 1) as span:
            call = operations.enqueue(
                queue, payload, priority=priority, delay_s=delay_s, max_attempts=max_attempts,
                idempotency_key=idempotency_key, held=held, parent=parent, debounce_key=debounce_key,
                debounce_s=debounce_s, max_wait_s=max_wait_s, keep=keep, group=group, dedupe_key=dedupe_key,
                trace_context=tracing.context_of(span),
            )  # fmt: skip
            enqueued: Enqueued = await self._run(call, conn)
            tracing.sent(span, [enqueued.task_id])
            return enqueued

    async def enqueue_many(
        self,
        queue: str,
        payloads: Sequence[JSON],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        priorities: Sequence[int] | None = None,
        delays_s: Sequence[float] | None = None,
        max_attempts: int | None = None,
        held: bool = False,
        parent: int | str | None = None,
        groups: Sequence[str | None] | None = None,
        group: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[Enqueued]:
        """Enqueue many tasks in one round trip; one answer per payload, in order.
        ``groups`` gives each task its group (parallel to ``payloads``),
        ``group`` one group for all."""
        with tracing.send(queue, len(payloads), "enqueue_many") as span:
            call = operations.enqueue_many(
                queue, payloads, idempotency_keys=idempotency_keys, priorities=priorities,
                delays_s=delays_s, max_attempts=max_attempts, held=held, parent=parent,
                groups=groups, group=group, trace_context=tracing.context_of(span),
            )  # fmt: skip
            return await self._run(call, conn)

    async def claim(
        self,
        queue: str,
        *,
        max_tasks: int = 1,
        lease_s: int | None = None,
        wait_s: float = 0.0,
        worker: str | None = None,
        key_id: int | None = None,
    ) -> list[Lease]:
        """Claim up to ``max_tasks`` tasks, each under a new lease.

        With ``wait_s`` (up to ``limits.MAX_WAIT_S``, 55) an empty queue is waited on, and the claim
        returns as soon as a task arrives (or a lease ends, on a queue at
        its concurrency limit, or the rate limit's next token is due);
        ``[]`` when none did. ``key_id``
        records the API key asking (a service's), for ``lease_tokens_for_key``.
        """
        wait_s = operations.check_wait(wait_s)
        worker = worker or self.worker_name
        if wait_s == 0:
            started_ns = tracing.clock_ns()
            leases: list[Lease] = await self._run(
                operations.claim(queue, worker=worker, max_tasks=max_tasks, lease_s=lease_s, key_id=key_id)
            )
            tracing.received(queue, leases, started_ns)
            return leases
        look = operations.claim_or_rate_wait(
            queue, worker=worker, max_tasks=max_tasks, lease_s=lease_s, key_id=key_id
        )
        deadline = time.monotonic() + wait_s
        async with self.watch(queue) as wake:
            woken = True
            rate_wait_s = 0.0
            while True:
                # Between wake-ups every waiter looks again each poll
                # interval (a delayed task comes due without a wake-up), but
                # waiters of one queue share their looks: after one found
                # nothing, the others sleep on for the interval. 1,000
                # long-polls on an idle queue cost one claim a second, not
                # 1,000.
                if woken or not self._looked_lately(queue):
                    started_ns = tracing.clock_ns()
                    leases, rate_wait_s = await self._run(look)
                    if leases:
                        tracing.received(queue, leases, started_ns)
                        return leases
                    self._looked_empty[queue] = time.monotonic()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                if 0 < rate_wait_s < min(remaining, self.poll_interval_s):
                    # An empty rate bucket sends no wake-up: look again
                    # when its next token is due.
                    await wake.wait(rate_wait_s)
                    woken, rate_wait_s = True, 0.0
                else:
                    woken = await wake.wait(min(remaining, self.poll_interval_s))

    def _looked_lately(self, queue: str) -> bool:
        """A claim of this client found ``queue`` empty within the poll interval."""
        return time.monotonic() - self._looked_empty.get(queue, -math.inf) < self.poll_interval_s

    def watch(self, queue: str) -> contextlib.AbstractAsyncContextManager[AsyncWake]:
        """Wait for work in ``queue``: ``async with client.watch(q) as wake:
        await wake.wait(timeout)`` returns early when a task may be claimable.

        Look for work between waits: ``wait`` also returns True at once when
        it had to register for wake-ups anew (see ``await_work``)."""
        return self._listener.watch(queue, self.await_work)

    async def rate_wait(self, queues: Sequence[str]) -> float:
        """Seconds until the first of ``queues`` held back by a rate limit
        (its own, or its groups' with tasks due) has a token again (0: none
        is held back)."""
        return await self._run(operations.rate_wait(queues))

    async def await_work(self, queue: str, for_s: float) -> bool:
        """Have ``queue`` send wake-ups for at least ``for_s`` more seconds.

        The engine sends NOTIFY only while someone awaits a queue, so that
        busy producers' commits do not queue behind each other. True when
        this registered anew: a task that arrived before the registration
        sent no wake-up, so look for work once more before sleeping. Call it
        while listening (``watch`` does it for you). A wait over half an
        hour is covered half an hour at a time."""
        now = time.monotonic()
        for_s = min(for_s, MAX_AWAIT_S / 2)
        if self._awaited.get(queue, 0.0) >= now + for_s + _AWAIT_MARGIN_S:
            return False
        register_s = max(_AWAIT_S, 2 * for_s)  # at most MAX_AWAIT_S, for_s being clamped
        await self._run(operations.await_work(queue, register_s))
        self._awaited[queue] = now + register_s
        return True

    def forget_awaited(self) -> None:
        """Register anew before the next wait: a listener that (re)connects
        calls this, since a server that restarted or failed over has lost
        the registrations (they live in an unlogged table)."""
        self._awaited.clear()

    async def lease_tokens_for_key(
        self, leases: Sequence[tuple[int | str, int]], key_id: int
    ) -> list[str]:
        """The lease tokens of leases named by ``(task id, fencing token)``,
        for the API key ``key_id`` that claimed them (a service checked it).

        A lease that key did not claim, or no longer the task's, gets a token
        that every write refuses as it refuses a forged one. Raises
        ``TaskNotFound`` for an unknown task.
        """
        return await self._run(operations.lease_tokens_for_key(leases, key_id))

    async def heartbeat(
        self, lease_token: str, *, lease_s: int | None = None, stage: str | None = None
    ) -> Submitted:
        """Extend the lease by ``lease_s`` (default: the claim's) from now.

        Raises ``LeaseLost`` when the lease is no longer held.
        """
        return await self._run(operations.heartbeat(lease_token, lease_s=lease_s, stage=stage))

    async def set_stage(self, lease_token: str, stage: str) -> Submitted:
        """Record what the holder is doing now (and extend the lease)."""
        return await self.heartbeat(lease_token, stage=stage)

    async def complete(
        self,
        lease_token: str,
        result: JSON = None,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        trace_context: JSON = None,
    ) -> Submitted:
        """Finish the task with ``result``. A repeat returns ``replayed``;
        raises ``LeaseLost`` when another holder has the task. The task's
        batons carry ``trace_context`` (default: the current span's, a
        worker's run) as their trace's parent."""
        run = trace_context if trace_context is not None else tracing.current()
        with tracing.settle(operations.queue_of(lease_token), "complete", 1):
            return await self._run(operations.complete(lease_token, result, trace_context=run), conn)

    async def complete_many(
        self, items: Sequence[tuple[str, JSON]], *, trace_contexts: Sequence[JSON] | None = None
    ) -> list[Submitted]:
        """Complete many ``(lease_token, result)`` pairs in one round trip.
        ``trace_contexts`` (parallel to ``items``): each run's, for its
        batons (default: the current span's for all).

        Refusals do not raise: check each reply's ``accepted``.
        """
        queues = {operations.queue_of(token) for token, _ in items}
        queue = queues.pop() if len(queues) == 1 else "(many)"
        if trace_contexts is None and (run := tracing.current()) is not None:
            trace_contexts = [run] * len(items)
        with tracing.settle(queue, "complete_many", len(items), trace_contexts or ()):
            return await self._run(operations.complete_many(items, trace_contexts=trace_contexts))

    async def fail(
        self,
        lease_token: str,
        error: JSON = None,
        *,
        retry_delay_s: float | None = None,
        requeue: bool = True,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> Submitted:
        """Fail this attempt: retry after ``retry_delay_s`` (default: the
        queue's backoff), or ``requeue=False`` to make the task dead now."""
        call = operations.fail(lease_token, error, retry_delay_s=retry_delay_s, requeue=requeue)
        with tracing.settle(operations.queue_of(lease_token), "fail", 1):
            return await self._run(call, conn)

    async def release_lease(self, lease_token: str) -> Submitted:
        """Give the lease back unfinished: claimable at once, attempt not counted."""
        return await self._run(operations.release_lease(lease_token))

    async def task(self, task_id: int | str) -> Task:
        """One task by id (``5521`` or ``"t_5521"``), hot or archived."""
        return await self._run(operations.task(task_id))

    async def set_aside_writes(self, task_ids: Sequence[int | str]) -> list[SetAsideWrite]:
        """The refused writes (late or forged) set aside for these tasks,
        oldest first per task, with who held the lease each one named."""
        return await self._run(operations.set_aside_writes(task_ids))

    async def tasks(
        self,
        queue: str,
        *,
        state: str | None = None,
        limit: int = 50,
        before_id: int | str | None = None,
    ) -> list[Task]:
        """The newest tasks of a queue, optionally in one state (or
        ``"scheduled"``: pending with a ``run_at`` still ahead)."""
        return await self._run(operations.tasks(queue, state=state, limit=limit, before_id=before_id))

    async def queues(
        self,
        queue: str | None = None,
        *,
        after: str | None = None,
        limit: int | None = None,
        patterns: Sequence[str] | None = None,
    ) -> list[QueueStats]:
        """Counts per state and oldest claimable age, per queue (by name). Exact;
        the finished states are kept as tasks finish, so this costs the same
        however large the archive.

        A page: the first ``limit`` queues named after ``after`` that match
        one of ``patterns`` (anchored POSIX regular expressions)."""
        return await self._run(operations.queues(queue, after=after, limit=limit, patterns=patterns))

    async def queue_configs(self, queues: Sequence[str] | None = None) -> list[QueueConfig]:
        """Every queue's settings by name, or only those of ``queues``."""
        return await self._run(operations.queue_configs(queues))

    async def configure_queue(
        self,
        queue: str,
        *,
        lease_s: int | None = None,
        max_attempts: int | None = None,
        backoff_base_s: float | None = None,
        backoff_max_s: float | None = None,
        retention_s: int | None = None,
        max_body_bytes: int | None = None,
        paused: bool | None = None,
        max_leased: int | None = None,
        group_max_leased: int | None = None,
        rate_limit: int | None = None,
        rate_period_s: float | None = None,
        group_rate_limit: int | None = None,
        actor: str | None = None,
    ) -> QueueConfig:
        """Create a queue or change its settings; None keeps a setting.

        Limits, held by the engine across all workers: ``max_leased`` tasks
        leased at once, ``group_max_leased`` per group (see ``enqueue``'s
        ``group``), ``rate_limit`` claims per ``rate_period_s`` (default 1),
        ``group_rate_limit`` claims per ``rate_period_s`` per group. 0
        removes a limit.

        ``actor`` names who asks in the settings audit (a service passes its
        caller's API key); by default the database role."""
        call = operations.configure_queue(
            queue, lease_s=lease_s, max_attempts=max_attempts, backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s, retention_s=retention_s,
            max_body_bytes=max_body_bytes, paused=paused, max_leased=max_leased,
            group_max_leased=group_max_leased, rate_limit=rate_limit,
            rate_period_s=rate_period_s, group_rate_limit=group_rate_limit, actor=actor,
        )  # fmt: skip
        return await self._run(call)

    async def pause(self, queue: str, *, actor: str | None = None) -> QueueConfig:
        """Stop handing out this queue's tasks (enqueue still works)."""
        return await self.configure_queue(queue, paused=True, actor=actor)

    async def resume(self, queue: str, *, actor: str | None = None) -> QueueConfig:
        return await self.configure_queue(queue, paused=False, actor=actor)

    async def add_schedule(
        self,
        name: str,
        cron: str,
        queue: str,
        payload: JSON = None,
        *,
        tz: str = "UTC",
        missed: str = "fire-once",
        actor: str | None = None,
    ) -> Schedule:
        """Enqueue ``payload`` into ``queue`` at each tick of ``cron`` (five
        fields, or six with seconds first), read in time zone ``tz``.

        A sweeper (``batonq serve``, ``batonq worker``, or ``sweeper=True``)
        fires each tick once, whichever process leads. ``missed``: a tick
        that passed while none ran fires once on recovery (``"fire-once"``)
        or not at all (``"skip"``). Replaces a schedule of the same name.
        """
        call = operations.add_schedule(name, cron, queue, payload, tz=tz, missed=missed, actor=actor)
        return await self._run(call)

    async def remove_schedule(self, name: str, *, actor: str | None = None) -> bool:
        """Remove a schedule; False if there was none."""
        return await self._run(operations.remove_schedule(name, actor=actor))

    async def pause_schedule(self, name: str, *, actor: str | None = None) -> Schedule:
        """Stop firing a schedule's ticks until resumed."""
        return await self._run(operations.pause_schedule(name, True, actor=actor))

    async def resume_schedule(self, name: str, *, actor: str | None = None) -> Schedule:
        """Fire a paused schedule's ticks again, from its next tick on (the
        ticks that passed while paused are not fired)."""
        return await self._run(operations.pause_schedule(name, False, actor=actor))

    async def schedules(self, queues: Sequence[str] | None = None) -> list[Schedule]:
        """Every schedule by name, or only those that enqueue into ``queues``."""
        return await self._run(operations.schedules_list(queues))

    async def schedule(self, name: str) -> Schedule | None:
        """The schedule of that name, or None."""
        return await self._run(operations.schedule(name))

    async def schedule_firings(self, name: str, *, limit: int = 50) -> list[ScheduleFiring]:
        """The ticks a schedule fired (the last week), newest first, with their tasks."""
        return await self._run(operations.schedule_firings(name, limit))

    async def settings_audit(
        self,
        *,
        kind: str | None = None,
        name: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[AuditEntry]:
        """Changes to queue settings and schedules, newest first: who, when,
        before and after. ``kind``: ``"queue"`` or ``"schedule"``."""
        call = operations.settings_audit(kind=kind, name=name, limit=limit, before_id=before_id)
        return await self._run(call)

    async def retry(self, task_id: int | str) -> Task:
        """Operator: run a dead or cancelled task again."""
        return await self._run(operations.retry(task_id))

    async def cancel(self, task_id: int | str) -> Task:
        """Operator: cancel an unfinished task."""
        return await self._run(operations.cancel(task_id))

    async def hold(self, task_id: int | str) -> Task:
        """Operator: keep a pending task back until released."""
        return await self._run(operations.hold(task_id))

    async def release(self, task_id: int | str) -> Task:
        """Operator: make a held task claimable."""
        return await self._run(operations.release(task_id))

    async def sweep(self) -> int:
        """Expire every queue's overdue leases now; returns how many."""
        return await self._run(operations.sweep())

    async def maintain(self) -> dict[str, int]:
        """Make archive partitions and apply retention now."""
        return await self._run(operations.maintain())

    async def add_edge(
        self,
        from_queue: str,
        to_queue: str,
        *,
        map: str | None = None,
        fan_out: str | None = None,
        when: str | None = None,
        equals: JSON = MISSING,
        present: bool | None = None,
        join: bool = False,
        partial: bool = False,
        priority: int | None = None,
        delay_s: float = 0.0,
    ) -> Edge:
        """Hand each result of ``from_queue`` on to ``to_queue``.

        - ``map``: JSON pointer into the result for the next payload (default: all of it);
        - ``fan_out``: JSON pointer to an array, one downstream task per element;
        - ``when`` with ``equals=value`` or ``present=True/False``: route only matching results;
        - ``join``: ``to_queue`` collects a fan-out into ``from_queue`` (``partial``: dead
          elements give null instead of a dead join);
        - ``priority`` (default: inherited) and ``delay_s`` for the new tasks.

        Raises ``GraphCycle`` when the edge would close a cycle.
        """
        call = operations.add_edge(
            from_queue, to_queue, map=map, fan_out=fan_out, when=when, equals=equals,
            present=present, join=join, partial=partial, priority=priority, delay_s=delay_s,
        )  # fmt: skip
        return await self._run(call)

    async def remove_edge(self, from_queue: str, to_queue: str) -> bool:
        """Stop new batons along an edge; tasks already handed on go on."""
        return await self._run(operations.remove_edge(from_queue, to_queue))

    async def edges(self) -> list[Edge]:
        return await self._run(operations.edges())

    async def run_tasks(self, root_id: int | str, limit: int | None = None) -> list[Task]:
        """The tasks of a run (the lineage under one root), oldest first:
        the first ``limit``, or every one."""
        return await self._run(operations.run_tasks(root_id, limit))

    async def run_status(self, root_id: int | str) -> RunStatus:
        """running, done, or failed at its first dead task (with the error)."""
        return await self._run(operations.run_status(root_id))

    async def queue_page(
        self,
        scopes: Sequence[str] = ("*",),
        *,
        search: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[QueueStats]:
        """Counts of a page of queues by name (after ``after``): those a key
        with ``scopes`` covers and whose name contains ``search``."""
        return await self._run(operations.queue_page(scopes, search=search, after=after, limit=limit))

    async def queue_count(self, scopes: Sequence[str] = ("*",), *, search: str | None = None) -> int:
        """How many queues ``queue_page`` pages through."""
        return await self._run(operations.queue_count(scopes, search=search))

    async def throughput(self, queues: Sequence[str], minutes: int = 15) -> list[Throughput]:
        """Tasks finished per queue and minute over the last ``minutes``."""
        return await self._run(operations.throughput(queues, minutes))

    async def find_tasks(
        self,
        queue: str,
        *,
        state: str | None = None,
        idempotency_key: str | None = None,
        worker: str | None = None,
        limit: int = 50,
        before_id: int | str | None = None,
    ) -> list[Task]:
        """The newest tasks of a queue, by state, idempotency key and last worker."""
        call = operations.find_tasks(
            queue, state=state, idempotency_key=idempotency_key, worker=worker, limit=limit,
            before_id=before_id,
        )
        return await self._run(call)

    async def tasks_by_key(self, key: str, scopes: Sequence[str] = ("*",), *, limit: int = 50) -> list[Task]:
        """The tasks enqueued with idempotency key ``key``, in any queue
        ``scopes`` cover (one per queue at most), newest first."""
        return await self._run(operations.tasks_by_key(scopes, key, limit))

    async def dead_tasks(
        self,
        scopes: Sequence[str] = ("*",),
        *,
        queue: str | None = None,
        error: str | None = None,
        limit: int = 50,
        before_id: int | str | None = None,
    ) -> list[Task]:
        """Dead tasks across the queues ``scopes`` cover, newest first."""
        call = operations.dead_tasks(scopes, queue=queue, error=error, limit=limit, before_id=before_id)
        return await self._run(call)

    async def worker_scorecards(
        self, scopes: Sequence[str] = ("*",), *, since_s: float = 86400.0
    ) -> list[Scorecard]:
        """Per worker name over the last ``since_s`` seconds: done, failed,
        dead, late writes refused, median duration, last seen."""
        return await self._run(operations.worker_scorecards(scopes, since_s=since_s))

    async def create_key(self, ring: int, queues: Sequence[str] = ("*",), name: str = "") -> NewKey:
        """Make an API key (ring 0 admin … 3 observer, queue glob scopes).
        Its secret is in the reply only: store it now."""
        return await self._run(operations.create_key(ring, queues, name))

    async def create_first_key(self) -> NewKey | None:
        """An admin key if there is no key yet (a service's first start), else None."""
        return await self._run(operations.create_first_key())

    async def key_for_auth(self, key_id: int) -> KeyAuth | None:
        return await self._run(operations.key_for_auth(key_id))

    async def create_session(self, key_id: int, secret_hash: bytes, token_hash: bytes) -> SessionAuth | None:
        """Start a dashboard session for key ``key_id`` presented with the
        secret whose sha256 is ``secret_hash``, under a token whose sha256 is
        ``token_hash``; None for a key that is unknown, revoked or not this."""
        return await self._run(operations.create_session(key_id, secret_hash, token_hash))

    async def session_for_auth(self, token_hash: bytes) -> SessionAuth | None:
        """The key behind the live session of the token whose sha256 is ``token_hash``."""
        return await self._run(operations.session_for_auth(token_hash))

    async def end_session(self, token_hash: bytes) -> bool:
        """End a dashboard session; False when there was none."""
        return await self._run(operations.end_session(token_hash))

    async def keys(self) -> list[ApiKey]:
        return await self._run(operations.keys())

    async def revoke_key(self, key_id: int) -> ApiKey:
        """Revoke a key: refused from the next request on."""
        return await self._run(operations.revoke_key(key_id))


async def connect_async(dsn: str | None = None, **options: Any) -> AsyncClient:
    """Open an AsyncClient. No ``dsn`` and no ``$BATONQ_DATABASE_URL`` starts
    the embedded PostgreSQL. ``options`` go to ``AsyncClient``."""
    dsn = await asyncio.to_thread(resolve_dsn, dsn)  # sync: dsn = resolve_dsn(dsn)
    return await AsyncClient(dsn, **options).open()
