"""batonq through PgBouncer in transaction mode (deploy/pgbouncer.ini):
pooled calls without server-side prepared statements or session state, and
wake-ups on a LISTEN connection straight to PostgreSQL, which registers
again after it reconnects (the unlogged registrations are lost on a crash or
a failover). ``BATONQ_TEST_PGBOUNCER=1`` runs the whole suite this way."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from tests.deployed import pgbouncer
from tests.waiting import wait_for

import batonq

Q = "pool:tasks"
NO_POLL_S = 30.0  # only a NOTIFY wakes a waiter in time
WAKE_LIMIT_S = 0.5


@pytest.fixture(scope="module")
def bouncer(server_dsn: str) -> Iterator[tuple[str, int]]:
    with pgbouncer(server_dsn) as address:
        yield address


@pytest.fixture
def pooled_dsn(direct_dsn: str, bouncer: tuple[str, int]) -> str:
    return make_conninfo(direct_dsn, host=bouncer[0], port=bouncer[1])


def listening(sql: psycopg.Connection[Any]) -> int:
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN batonq'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def claim_in_thread(client: batonq.Client, wait_s: float) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        out.append(client.claim(Q, wait_s=wait_s))
        out.append(time.monotonic())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_many_pooled_calls_on_many_connections_without_prepared_statements(
    pooled_dsn: str, direct_dsn: str
) -> None:
    """Repeated statements on a pool of 8 through the pooler: server-side
    prepared statements would be asked for on server connections that never
    saw them ("prepared statement ... does not exist")."""
    with batonq.connect(pooled_dsn, listen_dsn=direct_dsn, max_connections=8) as client:
        ids = {client.enqueue(Q, {"i": i}).task_id for i in range(40)}
        done: set[int] = set()
        errors: list[BaseException] = []

        def work() -> None:
            try:
                while leases := client.claim(Q):
                    for lease in leases:
                        client.heartbeat(lease.lease_token)
                        client.complete(lease.lease_token, {"ok": True})
                        done.add(lease.task_id)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert done == ids


def wake_latency(
    waiter: batonq.Client, producer: batonq.Client, sql: psycopg.Connection[Any], n: int
) -> float:
    """Seconds from an enqueue's commit to the return of a long-poll claim
    that was waiting for it, with polling too slow to matter."""
    thread, out = claim_in_thread(waiter, wait_s=10)
    wait_for(lambda: listening(sql) == 1, timeout=10, what="the listener on the server itself")
    listener = waiter._listener
    wait_for(lambda: listener._registry.of(Q), timeout=10, what="the claim to wait")  # type: ignore[attr-defined]
    wait_for(
        lambda: sql.execute("SELECT count(*) FROM batonq.awaited WHERE queue = %s", (Q,)).fetchone() == (1,),
        timeout=10, what="the waiter's registration",
    )  # fmt: skip
    task_id = producer.enqueue(Q, {"try": n}).task_id
    committed = time.monotonic()
    thread.join(timeout=15)
    leases, returned_at = out
    assert [lease.task_id for lease in leases] == [task_id]
    return float(returned_at - committed)


def test_a_long_poll_through_pgbouncer_is_woken_by_notify(
    pooled_dsn: str, direct_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    with (
        batonq.connect(pooled_dsn, listen_dsn=direct_dsn, poll_interval_s=NO_POLL_S) as waiter,
        batonq.connect(pooled_dsn, listen_dsn=direct_dsn) as producer,
    ):
        latencies = [wake_latency(waiter, producer, sql, n) for n in range(3)]
    assert max(latencies) < WAKE_LIMIT_S, latencies


def test_wake_ups_come_back_after_the_listener_reconnects(
    pooled_dsn: str, direct_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """A failover loses the unlogged registrations and the LISTEN connection:
    the client registers again once it listens again, and is woken as before."""
    with (
        batonq.connect(pooled_dsn, listen_dsn=direct_dsn, poll_interval_s=NO_POLL_S) as waiter,
        batonq.connect(pooled_dsn, listen_dsn=direct_dsn) as producer,
    ):
        assert wake_latency(waiter, producer, sql, 0) < WAKE_LIMIT_S
        sql.execute("TRUNCATE batonq.awaited")
        sql.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = 'LISTEN batonq'"
        )
        wait_for(lambda: listening(sql) == 0, timeout=10, what="the listener to drop")
        assert wake_latency(waiter, producer, sql, 1) < WAKE_LIMIT_S
