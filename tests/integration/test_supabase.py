"""batonq where the database's owner is not a superuser (Supabase's
``postgres`` role may create roles, nothing more): migrate and work as it;
row level security keeps every batonq row from other roles, such as a REST
layer's ``anon`` and ``authenticated``, while the engine's functions work."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as q
from psycopg.conninfo import make_conninfo
from tests.conftest import READER_ROLE, WORKER_ROLE, with_db
from tests.private_cluster import private_cluster
from tests.worker.support import eventually_async

import batonq
from batonq.migrate import migrations
from batonq.talos import LeaseQueue, run_worker


@contextlib.contextmanager
def _role(server: psycopg.Connection[Any], options: str) -> Iterator[str]:
    """A new cluster role with ``options``, dropped afterwards."""
    name = f"batonq_role_{uuid.uuid4().hex[:10]}"
    server.execute(q.SQL("CREATE ROLE {} " + options).format(q.Identifier(name)))
    try:
        yield name
    finally:
        server.execute(q.SQL("DROP OWNED BY {} CASCADE").format(q.Identifier(name)))
        server.execute(q.SQL("DROP ROLE {}").format(q.Identifier(name)))


@pytest.fixture
def owner_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh database (no batonq yet) owned by a login role that may create
    roles but is not a superuser; its DSN as that role."""
    database = f"batonq_owner_{uuid.uuid4().hex[:10]}"
    server = psycopg.connect(server_dsn, autocommit=True)
    with server, _role(server, "LOGIN CREATEROLE NOSUPERUSER") as owner:
        server.execute(
            q.SQL("CREATE DATABASE {} OWNER {}").format(q.Identifier(database), q.Identifier(owner))
        )
        try:
            yield make_conninfo(with_db(server_dsn, database), user=owner)
        finally:
            server.execute(q.SQL("DROP DATABASE {} WITH (FORCE)").format(q.Identifier(database)))


async def test_a_createrole_owner_migrates_and_works(owner_dsn: str) -> None:
    with psycopg.connect(owner_dsn) as conn:
        row = conn.execute(
            "SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    assert row == (False, True)
    assert batonq.migrate(owner_dsn) == migrations()
    assert batonq.migrate(owner_dsn) == []
    with batonq.connect(owner_dsn) as owner:
        owner.configure_queue("transcode", lease_s=30)
        assert owner.maintain()["partitions_created"] >= 0
        assert owner.sweep() == 0
    worker_dsn = make_conninfo(owner_dsn, user=WORKER_ROLE)
    with LeaseQueue(worker_dsn) as queue:
        job = queue.enqueue(kind="transcode", dedupe_key="video:892", payload={"video_id": 892})

        async def process_job(job: Any) -> dict[str, str]:
            queue.set_stage(job.id, worker_id="worker-1", stage="encoding")
            return {"status": "success"}

        async def done() -> batonq.Task | None:
            task = await asyncio.to_thread(queue.client.task, job.id)
            return task if task.state == "done" else None

        running = asyncio.create_task(
            run_worker(queue, process_job, worker_id="worker-1", kind="transcode", handle_signals=False)
        )
        try:
            task = await eventually_async(done, timeout=30)
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    assert (task.result, task.stage) == ({"status": "success"}, "encoding")
    with batonq.connect(make_conninfo(owner_dsn, user=READER_ROLE)) as reader:
        [stats] = reader.queues("transcode")
        assert stats.done == 1


def test_a_createrole_owner_makes_the_roles_on_a_new_server() -> None:
    """On a server batonq never saw (no batonq roles yet), the owner makes
    batonq's roles as it migrates, then login roles for its workers and its
    service. (The
    private server is PostgreSQL 16, where a CREATEROLE role administers only
    the roles it made; the shared one may be older.)"""
    with private_cluster() as cluster, psycopg.connect(cluster.dsn, autocommit=True) as server:
        server.execute("CREATE ROLE app_owner LOGIN CREATEROLE NOSUPERUSER")
        server.execute("CREATE DATABASE app OWNER app_owner")
        owner_dsn = make_conninfo(with_db(cluster.dsn, "app"), user="app_owner")
        assert batonq.migrate(owner_dsn) == migrations()
        with psycopg.connect(owner_dsn, autocommit=True) as owner:
            made = owner.execute(
                """SELECT r.rolname, pg_has_role(r.rolname, 'batonq_reader', 'MEMBER'),
                          pg_has_role(r.rolname, 'batonq_worker', 'MEMBER')
                     FROM pg_roles r WHERE r.rolname LIKE 'batonq%' ORDER BY 1"""
            ).fetchall()
            owner.execute("CREATE ROLE transcoder LOGIN IN ROLE batonq_worker")
            owner.execute("CREATE ROLE api LOGIN IN ROLE batonq_service")
        assert made == [
            ("batonq_reader", True, False), ("batonq_service", True, True), ("batonq_worker", True, True)
        ]  # fmt: skip
        with LeaseQueue(make_conninfo(owner_dsn, user="transcoder")) as queue:
            job = queue.enqueue(kind="transcode", dedupe_key="video:892", payload={"video_id": 892})
            [lease] = queue.client.claim("transcode")
            assert lease.task_id == job.id
            assert queue.client.complete(lease.lease_token, {"status": "success"}).outcome == "accepted"
        with batonq.connect(make_conninfo(owner_dsn, user="api")) as service:
            assert service.create_first_key() is not None  # batonq serve's first step


def _batonq_tables(conn: psycopg.Connection[Any]) -> dict[str, bool]:
    """Every batonq table and partition, and whether row level security is on."""
    rows = conn.execute(
        """SELECT c.relname, c.relrowsecurity FROM pg_class c
            WHERE c.relnamespace = 'batonq'::regnamespace AND c.relkind IN ('r', 'p')"""
    ).fetchall()
    return dict(rows)


def test_row_security_hides_every_row_from_other_roles(owner_dsn: str, server_dsn: str) -> None:
    batonq.migrate(owner_dsn)
    with batonq.connect(make_conninfo(owner_dsn, user=WORKER_ROLE)) as worker:
        worker.enqueue("transcode", {"video_id": 892}, idempotency_key="video:892")
        worker.enqueue("transcode", {"video_id": 893})
        [lease] = worker.claim("transcode")
        assert worker.complete(lease.lease_token, {"status": "success"}).outcome == "accepted"
    with psycopg.connect(owner_dsn, autocommit=True) as owner:
        owner.execute("SELECT batonq.ensure_partitions(current_date + 30, 2)")  # made later, by the engine
        tables = _batonq_tables(owner)
        assert {"tasks", "archive", "queues", "idempotency_keys", "api_keys", "archive_default"} <= set(
            tables
        )
        assert [name for name, on in tables.items() if not on] == []
        server = psycopg.connect(server_dsn, autocommit=True)
        with server, _role(server, "NOLOGIN") as rest:  # a REST layer's anon, given the schema
            for grant in (
                "GRANT USAGE ON SCHEMA batonq TO {}",
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA batonq TO {}",
            ):
                owner.execute(q.SQL(grant).format(q.Identifier(rest)))
            owner.execute(q.SQL("GRANT {} TO current_user").format(q.Identifier(rest)))
            owner.execute(q.SQL("SET ROLE {}").format(q.Identifier(rest)))
            for table in tables:
                count = owner.execute(q.SQL("SELECT count(*) FROM batonq.{}").format(q.Identifier(table)))
                assert count.fetchone() == (0,), table
            assert owner.execute("DELETE FROM batonq.tasks").rowcount == 0
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                owner.execute("INSERT INTO batonq.queues (name) VALUES ('stolen')")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function"):
                owner.execute("SELECT batonq.enqueue('transcode', '{}')")
            owner.execute("RESET ROLE")
            owner.execute(q.SQL("DROP OWNED BY {}").format(q.Identifier(rest)))
    with batonq.connect(make_conninfo(owner_dsn, user=WORKER_ROLE)) as worker:
        assert worker.claim("transcode")[0].row == {"video_id": 893}
        assert worker.enqueue("transcode", {}, idempotency_key="video:892").created is False
    with batonq.connect(make_conninfo(owner_dsn, user=READER_ROLE)) as reader:
        [stats] = reader.queues("transcode")
        assert (stats.leased, stats.done) == (1, 1)


class SyncClient:
    """A stand-in for supabase-py's client (batonq does not depend on it)."""

    __module__ = "supabase._sync.client"

    def __init__(self, supabase_url: str, supabase_key: str) -> None:
        self.supabase_url, self.supabase_key = supabase_url, supabase_key


def test_a_supabase_py_client_is_refused_naming_the_direct_connection_string() -> None:
    with pytest.raises(TypeError) as refused:
        LeaseQueue(SyncClient("https://xyz.supabase.co", "SERVICE_ROLE_KEY"))  # type: ignore[arg-type]
    assert str(refused.value) == (
        "LeaseQueue needs a PostgreSQL connection, not a supabase-py client: pass the project's direct "
        "connection string, postgresql://postgres:<password>@db.xyz.supabase.co:5432/postgres "
        "(Supabase dashboard: Connect, Direct connection); see docs/supabase.md"
    )
