"""Test databases on a real PostgreSQL.

``BATONQ_TEST_DATABASE_URL`` names the server (default: the machine's at
127.0.0.1:5432); ``embedded`` starts a private one from pgserver. The schema is
migrated once into a template database; every test gets its own copy.
The worker path runs as a login role that is only a member of batonq_worker.

``BATONQ_TEST_PGBOUNCER=1`` puts a PgBouncer in transaction mode (started for
the session, with deploy/pgbouncer.ini) in front of the worker and reader
DSNs and of the services, CLI and MCP processes the tests start
(``service_dsn``), with ``$BATONQ_LISTEN_URL`` naming the server itself for
LISTEN; the schema owner's own connections (migrations, ``sql``, ``admin``)
stay direct, as do tests marked ``direct``, which watch one session on the
server.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import batonq
from batonq.client import ENV_LISTEN_DSN

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
WORKER_ROLE = "batonq_test_worker"
READER_ROLE = "batonq_test_reader"
SERVICE_ROLE = "batonq_test_service"


def _server_dsn() -> Iterator[str]:
    url = os.environ.get("BATONQ_TEST_DATABASE_URL", DEFAULT_SERVER)
    if url != "embedded":
        yield url
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        with tempfile.TemporaryDirectory(prefix="batonq-test-pg-") as pgdata:
            server = pgserver.get_server(pgdata, cleanup_mode="stop")
            yield server.get_uri()
            server.cleanup()


def with_db(dsn: str, dbname: str, **extra: Any) -> str:
    params = conninfo_to_dict(dsn)
    params.update(dbname=dbname, **extra)
    return make_conninfo(**params)


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    yield from _server_dsn()


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    name = f"batonq_tmpl_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    batonq.migrate(with_db(server_dsn, name))
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        for role, member_of in (
            (WORKER_ROLE, "batonq_worker"), (READER_ROLE, "batonq_reader"), (SERVICE_ROLE, "batonq_service")
        ):
            with contextlib.suppress(psycopg.errors.DuplicateObject):
                conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE {member_of}")
    yield name
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_database(server_dsn: str, prefix: str, template: str | None = None) -> Iterator[str]:
    """A new database (a copy of ``template``, if given), dropped afterwards; yields its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield with_db(server_dsn, name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def admin_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh migrated database, as its owner (a superuser)."""
    with scratch_database(server_dsn, "batonq_t", template_db) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def pooler(server_dsn: str) -> Iterator[tuple[str, int] | None]:
    """(host, port) of the session's PgBouncer with BATONQ_TEST_PGBOUNCER=1, else None."""
    if os.environ.get("BATONQ_TEST_PGBOUNCER", "") in ("", "0"):
        yield None
        return
    from tests.deployed import pgbouncer

    with pgbouncer(server_dsn) as address:
        yield address


@pytest.fixture
def direct_dsn(admin_dsn: str) -> str:
    """The worker role's DSN straight to PostgreSQL, even behind PgBouncer."""
    return with_db(admin_dsn, conninfo_to_dict(admin_dsn)["dbname"], user=WORKER_ROLE)


def through_pooler(dsn: str, pooler: tuple[str, int] | None) -> str:
    """``dsn`` by way of the session's PgBouncer, when there is one."""
    return dsn if pooler is None else make_conninfo(dsn, host=pooler[0], port=pooler[1])


def pooled(
    direct: str,
    pooler: tuple[str, int] | None,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> str:
    """``direct`` through PgBouncer in that mode, unless the test is marked
    ``direct``; ``$BATONQ_LISTEN_URL`` (which the processes a test starts
    inherit) then names the server itself."""
    if pooler is None or request.node.get_closest_marker("direct") is not None:
        return direct
    monkeypatch.setenv(ENV_LISTEN_DSN, direct)
    return through_pooler(direct, pooler)


@pytest.fixture
def dsn(
    direct_dsn: str,
    pooler: tuple[str, int] | None,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> str:
    """The same database as a role with nothing but batonq_worker's grants
    (through PgBouncer in that mode, unless the test is marked ``direct``)."""
    return pooled(direct_dsn, pooler, monkeypatch, request)


@pytest.fixture
def service_dsn(
    admin_dsn: str,
    pooler: tuple[str, int] | None,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> str:
    """The schema owner's DSN for the processes a test starts (``batonq
    serve``, ``batonq mcp``, the CLI): through PgBouncer in that mode, unless
    the test is marked ``direct``."""
    return pooled(admin_dsn, pooler, monkeypatch, request)


@pytest.fixture
def serve_dsn(
    admin_dsn: str,
    pooler: tuple[str, int] | None,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> str:
    """The DSN ``batonq serve`` runs with in the tests: a role with nothing
    but batonq_service's grants, as in deploy/batonq.service (through
    PgBouncer in that mode, unless the test is marked ``direct``)."""
    return pooled(make_conninfo(admin_dsn, user=SERVICE_ROLE), pooler, monkeypatch, request)


@pytest.fixture
def reader_dsn(dsn: str) -> str:
    return make_conninfo(dsn, user=READER_ROLE)


@pytest.fixture
def service_client(dsn: str) -> Iterator[batonq.Client]:
    """A client as a role with nothing but batonq_service's grants, as
    ``batonq serve`` runs in deploy/batonq.service."""
    with batonq.connect(make_conninfo(dsn, user=SERVICE_ROLE), poll_interval_s=0.2) as c:
        yield c


@pytest.fixture
def client(dsn: str) -> Iterator[batonq.Client]:
    with batonq.connect(dsn, poll_interval_s=0.2) as c:
        yield c


@pytest.fixture
def admin(admin_dsn: str) -> Iterator[batonq.Client]:
    """A client as the schema owner: operator actions, queue settings."""
    with batonq.connect(admin_dsn) as c:
        yield c


@pytest.fixture
async def aclient(dsn: str) -> AsyncIterator[batonq.AsyncClient]:
    async with await batonq.connect_async(dsn, poll_interval_s=0.2) as c:
        yield c


@pytest.fixture
def sql(admin_dsn: str) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    """A superuser connection for looking behind the engine's back."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        yield conn


def age(conn: psycopg.Connection[Any], seconds: float) -> None:
    """Move the database's clock forward for batonq by pulling every task
    timestamp back: leases expire and delays pass as if time went by."""
    conn.execute(
        """UPDATE batonq.tasks SET run_at = run_at - make_interval(secs => %(s)s),
                  lease_expires_at = lease_expires_at - make_interval(secs => %(s)s)""",
        {"s": seconds},
    )
