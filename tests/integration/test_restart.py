"""A PostgreSQL restart cuts every pooled connection: the calls after it,
once the server is back, succeed (none of them gets a closed connection);
a long-poll waiting through it, behind PgBouncer, is woken as before.
Each test crashes and restarts a private cluster of its own; a client
opened while backends are terminated opens all the same."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import PoolTimeout
from tests.deployed import pgbouncer
from tests.e2e.live import LiveServer
from tests.private_cluster import PrivateCluster, private_cluster
from tests.waiting import wait_for

import batonq

POOL = 4
DOWN = (PoolTimeout, psycopg.OperationalError)


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as started:
        batonq.migrate(started.dsn)
        yield started


def test_client_calls_after_a_restart_succeed(cluster: PrivateCluster) -> None:
    with batonq.connect(cluster.dsn, min_connections=POOL, max_connections=POOL, listen=False) as client:
        client.enqueue("restart:q", 1)
        cluster.restart_immediate()
        # More calls than the pool has connections, each of which the restart closed.
        for i in range(2 * POOL):
            client.enqueue("restart:q", i)
        with client.transaction() as conn:
            client.enqueue("restart:q", "in a transaction", conn=conn)
        assert client.queues("restart:q")[0].pending == 2 * POOL + 2


def test_http_requests_after_a_restart_succeed(cluster: PrivateCluster) -> None:
    server = LiveServer(cluster.dsn)
    try:
        assert server.admin_key
        with server.http(server.admin_key) as http, ThreadPoolExecutor(20) as pool:
            # Twenty at once: the service's pool opens its twenty connections.
            assert {r.status_code for r in pool.map(lambda _: http.get("/v1/queues"), range(20))} == {200}
            cluster.restart_immediate()
            statuses = [http.post("/v1/enqueue", json={"queue": "restart:q", "payload": i}).status_code
                        for i in range(40)]  # fmt: skip
            assert statuses == [200] * 40
    finally:
        server.stop()


def registrations(dsn: str, queue: str) -> int:
    """Rows in the unlogged table of wake-up registrations (0 while the server is down)."""
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM batonq.awaited WHERE queue = %s", [queue]).fetchone()
    except psycopg.OperationalError:
        return 0
    return int(row[0]) if row else 0


def test_a_long_poll_through_pgbouncer_is_woken_after_a_crash_restart(cluster: PrivateCluster) -> None:
    """Crash recovery empties the unlogged registrations and cuts the LISTEN
    connection: the waiting claim registers again once its listener is
    back, and the next enqueue wakes it (its own polling is too slow to)."""
    queue = "restart:wake"
    with (
        pgbouncer(cluster.dsn) as (host, port),
        batonq.connect(
            make_conninfo(cluster.dsn, host=host, port=port), listen_dsn=cluster.dsn, poll_interval_s=60
        ) as waiter,
        ThreadPoolExecutor(1) as pool,
    ):
        claimed = pool.submit(waiter.claim, queue, wait_s=55)
        wait_for(lambda: registrations(cluster.dsn, queue) == 1, timeout=15, what="the waiter's registration")
        cluster.restart_immediate()
        assert registrations(cluster.dsn, queue) == 0, "crash recovery resets unlogged tables"
        wait_for(lambda: registrations(cluster.dsn, queue) == 1, timeout=15, what="the registration again")
        with batonq.connect(cluster.dsn, listen=False) as producer:
            task_id = producer.enqueue(queue, {"after": "the crash"}).task_id
        enqueued = time.monotonic()
        leases = claimed.result(timeout=15)
        woken_in = time.monotonic() - enqueued
    assert [lease.task_id for lease in leases] == [task_id]
    assert woken_in < 2, f"woken {woken_in:.2f} s after the enqueue"


def test_a_busy_pool_makes_calls_wait_and_an_absent_database_makes_them_fail_fast(
    cluster: PrivateCluster,
) -> None:
    """A call waits up to connection_wait_s for a busy pool's connection,
    but once the pool failed to connect it gives up within about a second,
    even a call that began to wait before the database went away."""
    options = {"min_connections": 1, "max_connections": 1, "listen": False, "connection_wait_s": 20.0}
    with batonq.connect(cluster.dsn, **options) as client, ThreadPoolExecutor(2) as threads:
        # Busy: the only connection is held for 3 s; a second call waits for it.
        def hold(seconds: float) -> None:
            with client.transaction() as conn:
                conn.execute("SELECT pg_sleep(%s)", (seconds,))

        holder = threads.submit(hold, 3.0)
        wait_for(lambda: client._pool.get_stats().get("pool_available", 1) == 0, timeout=10)
        began = time.monotonic()
        assert client.queues() == []
        assert time.monotonic() - began > 1.5  # it waited past the 1 s it would give a database down
        holder.result()

        # Absent: a call is waiting for the held connection when the server stops.
        holder = threads.submit(hold, 30.0)
        wait_for(lambda: client._pool.get_stats().get("pool_available", 1) == 0, timeout=10)
        waiter = threads.submit(client.queues)
        wait_for(lambda: client._pool.get_stats().get("requests_waiting", 0) >= 1, timeout=10)
        cluster.stop()
        stopped = time.monotonic()
        with pytest.raises(DOWN):
            waiter.result(timeout=30)
        assert time.monotonic() - stopped < 4.0, f"gave up {time.monotonic() - stopped:.1f} s after the stop"
        with pytest.raises(DOWN):
            holder.result(timeout=30)
        began = time.monotonic()
        with pytest.raises(DOWN):
            client.queues()
        assert time.monotonic() - began < 2.5

        cluster.start()
        wait_for(lambda: _answers(client), timeout=10)


def _answers(client: batonq.Client) -> bool:
    try:
        client.queues()
    except DOWN:
        return False
    return True


def test_clients_open_while_backends_are_terminated(dsn: str) -> None:
    """A client that opens while its connections are being cut (a backend
    terminated every 100 ms) opens all the same: a worker starting during a
    fault rides it out instead of exiting."""
    stop = threading.Event()

    def terminate() -> None:
        with psycopg.connect(dsn, autocommit=True, application_name="terminator") as conn:
            while not stop.wait(0.1):
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND backend_type = 'client backend'"
                )

    terminator = threading.Thread(target=terminate, daemon=True)
    terminator.start()
    try:
        for _ in range(40):
            with batonq.connect(dsn, listen=False, max_connections=2) as client:
                assert client.pooled is False
    finally:
        stop.set()
        terminator.join()
