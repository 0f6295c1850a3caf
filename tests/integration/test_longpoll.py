"""Long-poll claims: woken by LISTEN/NOTIFY within milliseconds of an enqueue,
on one listener connection per client however many waiters, or by polling
alone when LISTEN is off."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tests.waiting import wait_for

import batonq
from batonq import operations
from batonq.listener import Listener

# Tests marked `direct` stay off PgBouncer with BATONQ_TEST_PGBOUNCER=1: they
# tell a waiter's session apart on the server (which a pooler hides) or LISTEN
# on a connection of their own (which needs a session).

Q = "shop:tasks"
SENTINEL = "shop:sentinel"
AWAIT_SQL = "SELECT batonq.await_work(%s, 60)"
TRIES = 5
WAKE_LIMIT_S = 0.1
# So long that only a NOTIFY can wake a waiter in time: polling never does.
NO_POLL_S = 30.0

LISTENERS_SQL = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query = 'LISTEN batonq'"
# A waiter is waiting once its client ran a claim since `since` and went idle.
WAITING_SQL = """
    SELECT count(*) FROM pg_stat_activity
     WHERE datname = %(db)s AND application_name = %(app)s AND state = 'idle'
       AND query LIKE '%%batonq.claim(%%' AND query_start >= %(since)s"""


def _db(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


def _named(dsn: str, app: str) -> str:
    return make_conninfo(dsn, application_name=app)


def listeners(sql: psycopg.Connection[Any], dsn: str) -> int:
    row = sql.execute(LISTENERS_SQL, (_db(dsn),)).fetchone()
    assert row is not None
    return int(row[0])


def db_now(sql: psycopg.Connection[Any]) -> datetime:
    row = sql.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def wait_until_waiting(sql: psycopg.Connection[Any], dsn: str, app: str, since: datetime) -> None:
    def waiting() -> bool:
        row = sql.execute(WAITING_SQL, {"db": _db(dsn), "app": app, "since": since}).fetchone()
        return row is not None and row[0] >= 1

    wait_for(waiting, timeout=10, what=f"{app} to wait in its claim")


class Waiter:
    """``claim(wait_s=...)`` in a thread; notes when it returned."""

    def __init__(self, client: batonq.Client, wait_s: float, max_tasks: int = 1) -> None:
        self.leases: list[batonq.Lease] | None = None
        self.returned_at = 0.0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(client, wait_s, max_tasks), daemon=True)
        self._thread.start()

    def _run(self, client: batonq.Client, wait_s: float, max_tasks: int) -> None:
        try:
            self.leases = client.claim(Q, wait_s=wait_s, max_tasks=max_tasks)
        except BaseException as error:
            self.error = error
        self.returned_at = time.monotonic()

    def result(self, timeout: float) -> list[batonq.Lease]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the claim did not return"
        assert self.error is None, self.error
        assert self.leases is not None
        return self.leases


@contextlib.contextmanager
def connect(dsn: str, app: str, **options: Any) -> Iterator[batonq.Client]:
    with batonq.connect(_named(dsn, app), **options) as c:
        yield c


@pytest.mark.direct  # finds the waiter's session in pg_stat_activity
def test_sync_waiter_wakes_within_100ms_of_enqueue(
    client: batonq.Client, dsn: str, sql: psycopg.Connection[Any]
) -> None:
    latencies: list[float] = []
    with connect(dsn, "sync-waiter", poll_interval_s=NO_POLL_S) as waiter_client:
        for n in range(TRIES):
            since = db_now(sql)
            waiter = Waiter(waiter_client, wait_s=5)
            wait_until_waiting(sql, dsn, "sync-waiter", since)
            task_id = client.enqueue(Q, {"try": n}).task_id  # from this thread, committed on return
            committed = time.monotonic()
            assert [lease.task_id for lease in waiter.result(timeout=10)] == [task_id]
            latencies.append(waiter.returned_at - committed)
    assert statistics.median(latencies) < WAKE_LIMIT_S, latencies


@pytest.mark.direct  # finds the waiter's session in pg_stat_activity
async def test_async_waiter_wakes_within_100ms_of_enqueue(aclient: batonq.AsyncClient, dsn: str) -> None:
    app = "async-waiter"
    latencies: list[float] = []
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe,
        await batonq.connect_async(_named(dsn, app), poll_interval_s=NO_POLL_S) as waiter_client,
    ):

        async def waiting(since: datetime) -> None:
            deadline = time.monotonic() + 10
            while True:
                cursor = await probe.execute(WAITING_SQL, {"db": _db(dsn), "app": app, "since": since})
                row = await cursor.fetchone()
                if row is not None and row[0] >= 1:
                    return
                assert time.monotonic() < deadline, "the async waiter never waited"
                await asyncio.sleep(0.05)

        async def claim() -> tuple[list[batonq.Lease], float]:
            leases = await waiter_client.claim(Q, wait_s=5)
            return leases, time.monotonic()

        for n in range(TRIES):
            cursor = await probe.execute("SELECT clock_timestamp()")
            row = await cursor.fetchone()
            assert row is not None
            waiter = asyncio.create_task(claim())
            await waiting(row[0])
            task_id = (await aclient.enqueue(Q, {"try": n})).task_id  # another task, its own client
            committed = time.monotonic()
            leases, returned_at = await asyncio.wait_for(waiter, timeout=10)
            assert [lease.task_id for lease in leases] == [task_id]
            latencies.append(returned_at - committed)
    assert statistics.median(latencies) < WAKE_LIMIT_S, latencies


@pytest.mark.direct  # finds the waiter's session in pg_stat_activity
def test_twenty_waiters_share_one_listener_connection(
    client: batonq.Client, dsn: str, sql: psycopg.Connection[Any]
) -> None:
    n = 20
    with connect(dsn, "many-waiters", poll_interval_s=NO_POLL_S) as waiter_client:
        waiters = [Waiter(waiter_client, wait_s=20) for _ in range(n)]
        # Every waiter is in its claim's wait once it is registered with the
        # client's listener and that listener is connected (looked up inside
        # the client: nothing outside can tell).
        listener = waiter_client._listener
        assert isinstance(listener, Listener)
        wait_for(
            lambda: len(listener._registry.of(Q)) == n and listener._ready.is_set(),
            timeout=10,
            what="20 waiters registered with a connected listener",
        )
        assert listeners(sql, dsn) == 1
        row = sql.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (_db(dsn), "many-waiters"),
        ).fetchone()
        assert row is not None and row[0] <= 1 + 10, "more connections than the pool and one listener"

        enqueued = {e.task_id for e in client.enqueue_many(Q, [{"i": i} for i in range(n)])}
        claimed = [lease.task_id for w in waiters for lease in w.result(timeout=10)]
        assert sorted(claimed) == sorted(enqueued)
        assert listeners(sql, dsn) == 1
    assert wait_for(lambda: listeners(sql, dsn) == 0, timeout=5, what="the listener to close")


@pytest.mark.direct  # finds the waiter's session in pg_stat_activity
def test_poll_only_mode_returns_the_task_without_listening(
    client: batonq.Client, dsn: str, sql: psycopg.Connection[Any]
) -> None:
    with connect(dsn, "poller", listen=False, poll_interval_s=0.2) as poller:
        since = db_now(sql)
        waiter = Waiter(poller, wait_s=5)
        wait_until_waiting(sql, dsn, "poller", since)
        assert listeners(sql, dsn) == 0
        task_id = client.enqueue(Q, {"polled": True}).task_id
        committed = time.monotonic()
        assert [lease.task_id for lease in waiter.result(timeout=10)] == [task_id]
        assert waiter.returned_at - committed < 0.2 + 0.5  # within a poll interval, give or take
        assert listeners(sql, dsn) == 0


def test_wait_on_an_empty_queue_returns_nothing_after_wait_s(client: batonq.Client) -> None:
    client.enqueue(Q, "make the queue exist")
    [lease] = client.claim(Q)
    started = time.monotonic()
    assert client.claim(Q, wait_s=0.5) == []
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 1.2, elapsed
    client.complete(lease.lease_token)


async def test_async_wait_on_an_empty_queue_returns_nothing_after_wait_s(
    aclient: batonq.AsyncClient,
) -> None:
    started = time.monotonic()
    assert await aclient.claim("nobody:here", wait_s=0.5) == []
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 1.2, elapsed


async def test_wait_s_is_at_most_55(client: batonq.Client, aclient: batonq.AsyncClient) -> None:
    for wait_s in (56, 55.01, -1):
        with pytest.raises(batonq.InvalidArgument, match="wait_s"):
            client.claim(Q, wait_s=wait_s)
        with pytest.raises(batonq.InvalidArgument, match="wait_s"):
            await aclient.claim(Q, wait_s=wait_s)


@pytest.mark.direct  # LISTENs on a connection of its own
def test_an_enqueue_that_commits_after_a_claim_drained_the_queue_still_wakes(dsn: str) -> None:
    """The interleaving that loses a wake-up when an enqueue stays silent
    because it saw a pending task: a claimer takes that task, looks again
    before the enqueue commits, finds nothing and sleeps. The enqueue's
    commit must still notify."""
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn) as claimer,
        psycopg.connect(dsn) as enqueuer,
    ):
        enqueuer.execute("SELECT batonq.enqueue(%s, '{\"n\": 1}')", (Q,))
        enqueuer.commit()
        listener.execute("LISTEN batonq")
        listener.execute(AWAIT_SQL, (Q,))
        # The claimer locks task 1; meanwhile task 2 is enqueued, uncommitted.
        [first] = claimer.execute("SELECT task_id FROM batonq.claim(%s)", (Q,)).fetchall()
        enqueuer.execute("SELECT batonq.enqueue(%s, '{\"n\": 2}')", (Q,))
        claimer.commit()
        # The claimer's next look finds nothing: task 2 is not committed yet.
        assert claimer.execute("SELECT task_id FROM batonq.claim(%s)", (Q,)).fetchall() == []
        claimer.commit()
        enqueuer.commit()
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert woken == [Q], "the claimer sleeps until its next poll with task 2 pending"
        [second] = claimer.execute("SELECT task_id FROM batonq.claim(%s)", (Q,)).fetchall()
        assert second != first


@pytest.mark.direct  # LISTENs on a connection of its own
@pytest.mark.parametrize(
    ("delays_s", "wakes"),
    [([60.0, 60.0], False), ([60.0, 0.0], True), ([60.0], True), (None, True)],
    ids=["all-delayed", "one-now", "shorter-list", "no-delays"],
)
def test_enqueue_many_wakes_claimers_only_when_a_task_is_claimable_now(
    client: batonq.Client, dsn: str, delays_s: list[float] | None, wakes: bool
) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN batonq")
        for queue in (Q, SENTINEL):
            listener.execute(AWAIT_SQL, (queue,))
        client.enqueue_many(Q, [{"n": 1}, {"n": 2}], delays_s=delays_s)
        assert (Q in woken_before_sentinel(client, listener)) is wakes


def woken_before_sentinel(client: batonq.Client, listener: psycopg.Connection[Any]) -> list[str]:
    """The queues notified so far: enqueues a task to the (awaited) sentinel
    queue and collects notifications up to its own. Notifications arrive in
    commit order, so one sent earlier would have arrived by then."""
    client.enqueue(SENTINEL, {})
    woken: list[str] = []
    for notify in listener.notifies(timeout=5):
        woken.append(notify.payload)
        if notify.payload == SENTINEL:
            break
    assert woken[-1:] == [SENTINEL], "the sentinel's notification never came"
    return woken[:-1]


@pytest.mark.direct  # LISTENs on a connection of its own
def test_enqueues_notify_only_while_someone_awaits_the_queue(
    client: batonq.Client, dsn: str, sql: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN batonq")
        listener.execute(AWAIT_SQL, (SENTINEL,))
        client.enqueue(Q, {"awaited": False})
        assert woken_before_sentinel(client, listener) == []
        assert client.await_work(Q, 30) is True, "a new registration"
        assert client.await_work(Q, 30) is False, "still registered for long enough"
        client.enqueue(Q, {"awaited": True})
        assert woken_before_sentinel(client, listener) == [Q]
        sql.execute("UPDATE batonq.awaited SET until = now() - interval '1 second' WHERE queue = %s", (Q,))
        client.enqueue(Q, {"awaited": "no longer"})
        assert woken_before_sentinel(client, listener) == []


def test_await_work_rejects_a_bad_duration(client: batonq.Client) -> None:
    for for_s in (0, -1, 3601):
        with pytest.raises(batonq.InvalidArgument, match="for_s"):
            client._run(operations.await_work(Q, for_s))


class Registrant:
    """In a thread: await_work on ``Q``, then one claim, as a waiter does."""

    def __init__(self, dsn: str) -> None:
        self.claimed: list[int] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(dsn,), daemon=True)
        self._thread.start()

    def _run(self, dsn: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(AWAIT_SQL, (Q,))
                self.claimed = [r[0] for r in conn.execute("SELECT task_id FROM batonq.claim(%s)", (Q,))]
        except BaseException as error:
            self.error = error

    def result(self, timeout: float) -> list[int]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "await_work did not return"
        assert self.error is None, self.error
        assert self.claimed is not None
        return self.claimed


def registrations_waiting(sql: psycopg.Connection[Any]) -> int:
    row = sql.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE d.datname = current_database() AND l.locktype = 'advisory'"
        " AND l.mode = 'ExclusiveLock' AND NOT l.granted"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_registration_waits_for_the_enqueue_that_is_committing(
    dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """The enqueue looked for waiters before the registration and found none,
    so it will not notify: the waiter's look after registering must see its
    task, so registering waits for that enqueue to commit."""
    with psycopg.connect(dsn) as enqueuer:
        [(task_id,)] = enqueuer.execute("SELECT task_id FROM batonq.enqueue(%s, '{}')", (Q,)).fetchall()
        registrant = Registrant(dsn)
        wait_for(
            lambda: registrations_waiting(sql) == 1, timeout=10, what="await_work to wait on the enqueue"
        )
        enqueuer.commit()
        assert registrant.result(timeout=10) == [task_id]


@pytest.mark.direct  # LISTENs on a connection of its own
def test_a_registration_does_not_wait_for_a_transaction_left_open(
    client: batonq.Client, dsn: str, sql: psycopg.Connection[Any]
) -> None:
    with (
        psycopg.connect(dsn) as enqueuer,
        psycopg.connect(dsn, autocommit=True) as listener,
    ):
        listener.execute("LISTEN batonq")
        listener.execute(AWAIT_SQL, (SENTINEL,))
        # The queue exists before: the first enqueue to a new queue holds
        # its row until it commits.
        sql.execute("SELECT batonq.configure_queue(%s)", (Q,))
        enqueuer.execute("SELECT batonq.enqueue(%s, '{}')", (Q,))
        # Registers after lock_timeout, with the enqueuer's transaction still open.
        assert Registrant(dsn).result(timeout=10) == []
        client.enqueue(Q, {"after": "the registration"})
        assert woken_before_sentinel(client, listener) == [Q]
        enqueuer.commit()
    assert len(client.claim(Q, max_tasks=5)) == 2


@pytest.mark.direct  # LISTENs on a connection of its own
def test_an_enqueue_does_not_wait_for_a_registration_under_way(client: batonq.Client, dsn: str) -> None:
    """A registration holds its lock until it commits; an enqueue meanwhile
    notifies without looking instead of queueing behind it."""
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn) as registering,
        psycopg.connect(dsn, autocommit=True) as producer,
    ):
        listener.execute("LISTEN batonq")
        listener.execute(AWAIT_SQL, (SENTINEL,))
        registering.execute(AWAIT_SQL, (Q,))  # not committed: the lock stays taken
        producer.execute("SET lock_timeout = '5s'")
        producer.execute("SELECT batonq.enqueue(%s, '{}')", (Q,))  # LockNotAvailable if it waited
        registering.rollback()
        assert woken_before_sentinel(client, listener) == [Q]


@pytest.mark.direct  # LISTENs on a connection of its own
@pytest.mark.parametrize(("retry_delay_s", "wakes"), [(0, True), (30, False)])
def test_a_failed_task_retried_at_once_wakes_claimers(
    client: batonq.Client, dsn: str, retry_delay_s: float, wakes: bool
) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN batonq")
        for queue in (Q, SENTINEL):
            listener.execute(AWAIT_SQL, (queue,))
        client.enqueue(Q, {})
        [lease] = client.claim(Q)
        assert woken_before_sentinel(client, listener) == [Q], "the enqueue's own wake-up"
        client.fail(lease.lease_token, {"error": "flaky"}, retry_delay_s=retry_delay_s)
        assert (Q in woken_before_sentinel(client, listener)) is wakes


def registered(sql: psycopg.Connection[Any], queue: str) -> bool:
    row = sql.execute(
        "SELECT count(*) FROM batonq.awaited WHERE queue = %s AND until > now()", (queue,)
    ).fetchone()
    return row is not None and row[0] == 1


def test_a_waiter_registers_again_after_the_server_lost_its_registration(
    client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    """After a crash or a failover the (unlogged) registrations are gone and
    the listener reconnects: the next wait registers anew."""
    with client.watch(Q) as wake:
        assert registered(sql, Q)
        sql.execute("TRUNCATE batonq.awaited")
        sql.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = 'LISTEN batonq'"
        )

        def registered_again() -> bool:
            wake.wait(0.1)
            return registered(sql, Q)

        wait_for(registered_again, timeout=10, what="the waiter to register again")
