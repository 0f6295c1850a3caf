"""batonq through PgBouncer in transaction mode (deploy/pgbouncer.ini):
pooled calls without server-side prepared statements or session state, and
wake-ups on a LISTEN connection straight to PostgreSQL, which registers
again after it reconnects (the unlogged registrations are lost on a crash or
a failover). ``BATONQ_TEST_PGBOUNCER=1`` runs the whole suite this way."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from tests.deployed import pgbouncer
from tests.e2e.live import LiveServer, free_port
from tests.waiting import wait_for
from tests.worker.support import BATONQ, ROOT

import batonq
from batonq.client import ENV_LISTEN_DSN
from batonq.client_sync import transaction_pooled

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


# -- without a URL straight to PostgreSQL (deployment.md, "Without a direct connection")


@pytest.fixture
def no_listen_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_LISTEN_DSN, raising=False)


@pytest.fixture
def owner_pooled_dsn(admin_dsn: str, bouncer: tuple[str, int]) -> str:
    return make_conninfo(admin_dsn, host=bouncer[0], port=bouncer[1])


@pytest.mark.usefixtures("no_listen_url")
def test_a_transaction_pooler_is_told_from_postgresql(pooled_dsn: str, direct_dsn: str) -> None:
    """Through the pooler a client prepares nothing; straight to PostgreSQL
    it prepares repeated statements as before."""
    assert transaction_pooled(pooled_dsn)
    assert not transaction_pooled(direct_dsn)
    with batonq.connect(direct_dsn) as client:
        assert client.pooled is False


@pytest.mark.usefixtures("no_listen_url")
def test_poll_only_through_the_pooler_shared_by_four_threads(pooled_dsn: str) -> None:
    """``listen=False`` and nothing else: the client finds the pooler and
    prepares nothing (four threads on one client once ran each other's
    prepared statements: "prepared statement _pg3_0 does not exist")."""
    with batonq.connect(pooled_dsn, listen=False, max_connections=4) as client:
        assert client.pooled
        ids: set[int] = set()
        done: set[int] = set()
        errors: list[BaseException] = []

        def work(thread: int) -> None:
            try:
                for n in range(30):
                    ids.add(client.enqueue(Q, {"thread": thread, "n": n}).task_id)
                    for lease in client.claim(Q, max_tasks=2):
                        client.complete(lease.lease_token, {"by": thread})
                        done.add(lease.task_id)
                while leases := client.claim(Q):
                    for lease in leases:
                        client.complete(lease.lease_token)
                        done.add(lease.task_id)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        assert len(ids) == 120 and done == ids


@pytest.mark.usefixtures("no_listen_url")
def test_listening_through_the_pooler_needs_a_direct_url_and_says_so_at_open(pooled_dsn: str) -> None:
    with pytest.raises(batonq.DirectConnectionNeeded, match=r"\$BATONQ_LISTEN_URL"):
        batonq.connect(pooled_dsn)
    # The CLI: only a command that waits listens.
    assert _batonq("--dsn", pooled_dsn, "enqueue", Q, "{}").returncode == 0
    waiting = _batonq("--dsn", pooled_dsn, "claim", Q, "--wait", "1")
    assert waiting.returncode == 1
    assert "error: direct_connection_needed:" in waiting.stderr
    assert _batonq("--dsn", pooled_dsn, "claim", Q).returncode == 0


def _batonq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A ``batonq`` command from the repo root, without $BATONQ_LISTEN_URL."""
    env = {k: v for k, v in os.environ.items() if k != ENV_LISTEN_DSN}
    return subprocess.run(
        [BATONQ, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_batonq_worker_no_listen_through_the_pooler_does_every_task(
    pooled_dsn: str, direct_dsn: str
) -> None:
    """docs/worker.md's poll-only worker, with no $BATONQ_LISTEN_URL: every
    task done (it once exited 1 after 12-40 of 60); listening instead is
    refused at start."""
    with batonq.connect(direct_dsn) as client:
        ids = {e.task_id for e in client.enqueue_many("proc:sync", [{"sleep": 0}] * 60)}
        app = "tests.worker.worker_apps:app"
        listening = _batonq("worker", app, "--queues", "proc:sync", "--burst", "--dsn", pooled_dsn)
        assert listening.returncode == 1, listening.stderr
        assert "error: direct_connection_needed:" in listening.stderr
        polling = _batonq("worker", app, "--queues", "proc:sync", "--burst", "--no-listen",
                          "--concurrency", "4", "--dsn", pooled_dsn)  # fmt: skip
        assert polling.returncode == 0, polling.stderr
        assert {t.id for t in client.tasks("proc:sync", state="done", limit=100)} == ids


@pytest.mark.usefixtures("no_listen_url")
def test_sweepers_through_the_pooler_elect_one_leader_and_leave_no_lock(
    pooled_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """Three clients with sweepers through PgBouncer: one leads at any
    moment (a session lock taken through the pooler let each lead, and
    stayed on a server connection after they closed)."""
    clients = [batonq.connect(pooled_dsn, listen=False, sweeper=True) for _ in range(3)]
    try:
        sweepers = [c._sweeper for c in clients]
        assert all(s is not None for s in sweepers)

        def leaders() -> int:
            return sum(1 for s in sweepers if s is not None and s.is_leader)

        wait_for(lambda: leaders() == 1, timeout=10, what="a leader")
        watched_until = time.monotonic() + 3  # three sweeps each
        while time.monotonic() < watched_until:
            assert leaders() == 1
            time.sleep(0.05)
    finally:
        for client in clients:
            client.close()
    locks = sql.execute(
        """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
    ).fetchone()
    assert locks == (0,)
    assert sql.execute("SELECT count(*) FROM batonq.leaders WHERE expires_at > now()").fetchone() == (0,)


# -- batonq serve (deployment.md, "PgBouncer")


def test_serve_through_the_pooler_as_deployment_md_shows(
    owner_pooled_dsn: str, admin_dsn: str, direct_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """$BATONQ_DATABASE_URL the pooler, $BATONQ_LISTEN_URL PostgreSQL: the
    service starts and a long-poll is woken by an enqueue. Without the
    listen URL it refuses to start, saying why; as a role that is only
    batonq_worker's it refuses too (checking keys takes batonq_service)."""
    no_listen = _batonq("--dsn", owner_pooled_dsn, "serve", "--port", str(free_port()))
    assert no_listen.returncode == 1
    assert "error: direct_connection_needed:" in no_listen.stderr
    as_worker = _batonq("--dsn", direct_dsn, "serve", "--port", str(free_port()))
    assert as_worker.returncode == 1
    assert "error: permission_denied: batonq serve checks API keys" in as_worker.stderr

    server = LiveServer(owner_pooled_dsn, "--workers", "2", listen_dsn=admin_dsn)
    try:
        assert server.admin_key
        with server.http(server.admin_key) as http:
            out: list[Any] = []

            def claim() -> None:
                out.append(http.post("/v1/claim", json={"queue": Q, "wait_s": 20}))

            waiting = threading.Thread(target=claim, daemon=True)
            waiting.start()
            with server.http(server.admin_key) as other:
                awaited = "SELECT count(*) FROM batonq.awaited WHERE queue = %s"
                wait_for(lambda: sql.execute(awaited, (Q,)).fetchone() == (1,), timeout=30, what="a waiter")
                assert other.post("/v1/enqueue", json={"queue": Q, "payload": {}}).status_code == 200
            waiting.join(timeout=15)
            assert out[0].status_code == 200 and out[0].json()["lease_token"], out[0].text
    finally:
        server.stop()

