"""Migrations: once, concurrently, by psql; the schema matches the code; the
roles get nothing but the functions."""

from __future__ import annotations

import dataclasses
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.catalog import snapshot
from tests.conftest import with_db

import batonq
from batonq import models
from batonq.migrate import ENGINE, Migration, engine_current, migrations, pending, script

SQL_DIR = Path(models.__file__).resolve().parent / "sql"
PSQL = "/usr/bin/psql"


@pytest.fixture
def empty_db(server_dsn: str) -> Iterator[Callable[[], str]]:
    """Makes empty databases (no batonq schema); drops them afterwards."""
    made: list[str] = []

    def make() -> str:
        name = f"batonq_m_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return with_db(server_dsn, name)

    yield make
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def applied(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        return [(v, n) for v, n in conn.execute("SELECT version, name FROM batonq.migrations ORDER BY 1")]


def shipped() -> list[tuple[int, str]]:
    return [(m.version, m.name) for m in migrations()]


def test_migrate_twice_is_a_no_op(empty_db: Callable[[], str]) -> None:
    dsn = empty_db()
    assert pending(dsn) == migrations()
    first = batonq.migrate(dsn)
    assert [(m.version, m.name) for m in first] == shipped()
    before = snapshot(dsn)
    assert batonq.migrate(dsn) == []
    assert pending(dsn) == []
    assert applied(dsn) == shipped()
    assert snapshot(dsn) == before


def test_a_database_owner_without_createrole_migrates_where_the_roles_exist(
    server_dsn: str, template_db: str
) -> None:
    """The roles are cluster-wide: once a superuser (or the template) made
    them, an owner with no more than CREATEDB can set batonq up."""
    owner = f"batonq_owner_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{owner}" LOGIN CREATEDB')
        conn.execute(f'CREATE DATABASE "{owner}" OWNER "{owner}"')
    try:
        dsn = with_db(server_dsn, owner, user=owner)
        assert [m.version for m in batonq.migrate(dsn)] == [v for v, _ in shipped()]
        with batonq.connect(dsn, listen=False) as client:
            task = client.enqueue("owner:q", {"n": 1})
            [lease] = client.claim("owner:q")
            assert lease.task_id == task.task_id
            assert client.complete(lease.lease_token, "ok").outcome == "accepted"
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{owner}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{owner}"')


def test_concurrent_migrations_apply_once(empty_db: Callable[[], str]) -> None:
    dsn = empty_db()
    start = threading.Barrier(4)
    results: dict[int, list[Migration]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            start.wait(timeout=30)
            results[i] = batonq.migrate(dsn)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(results) == 4
    lengths = sorted(len(done) for done in results.values())
    assert lengths == [0, 0, 0, len(shipped())], "exactly one migrator applied everything"
    assert applied(dsn) == shipped()

    reference = empty_db()
    batonq.migrate(reference)
    assert snapshot(dsn) == snapshot(reference)
    # And the concurrently migrated database works.
    with batonq.connect(dsn) as client:
        client.enqueue("m:q", 1)
        [lease] = client.claim("m:q")
        assert client.complete(lease.lease_token, 2).outcome == "accepted"


def _psql(dsn: str, file: Path) -> None:
    run = subprocess.run(
        [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, f"{file.name}: {run.stderr}"
    assert "ERROR" not in run.stderr, run.stderr


def test_the_sql_directories_hold_what_migrate_applies() -> None:
    migration_files = sorted(p.name for p in (SQL_DIR / "migrations").iterdir())
    assert migration_files == [f"{v:04d}_{n}.sql" for v, n in shipped()]
    assert sorted(p.name for p in (SQL_DIR / "engine").iterdir()) == sorted(f"{name}.sql" for name in ENGINE)
    assert not list(SQL_DIR.glob("*.sql")), "SQL goes in migrations/ or engine/"


def test_the_shipped_sql_file_is_print_sql() -> None:
    """sql/batonq.sql, for ``psql -d mydb -f sql/batonq.sql``, is what
    ``batonq migrate --print-sql`` prints (tests/worker/test_talos.py applies
    it with psql and runs a program on it)."""
    shipped_file = Path(__file__).resolve().parents[2] / "sql" / "batonq.sql"
    assert shipped_file.read_text(encoding="utf-8") == script(), (
        "sql/batonq.sql is stale: batonq migrate --print-sql > sql/batonq.sql"
    )


def test_psql_files_match_migrate(empty_db: Callable[[], str], tmp_path: Path) -> None:
    """The files one by one, or the one script of --print-sql, by psql give
    what batonq migrate gives, and migrate then finds nothing pending."""
    by_files, by_script, by_migrate = empty_db(), empty_db(), empty_db()
    for version, name in shipped():
        _psql(by_files, SQL_DIR / "migrations" / f"{version:04d}_{name}.sql")
    for name in ENGINE:
        _psql(by_files, SQL_DIR / "engine" / f"{name}.sql")
    (tmp_path / "batonq.sql").write_text(script())
    _psql(by_script, tmp_path / "batonq.sql")
    batonq.migrate(by_migrate)

    assert applied(by_files) == applied(by_script) == applied(by_migrate) == shipped()
    assert pending(by_files) == pending(by_script) == []
    reference = snapshot(by_migrate)
    assert len(reference["functions"]) > 20
    assert snapshot(by_files) == reference
    assert snapshot(by_script) == reference
    assert engine_current(by_script) and engine_current(by_migrate)
    assert batonq.migrate(by_script) == [], "migrate sees a psql-applied schema as current"
    assert snapshot(by_script) == reference


def test_migrate_replaces_an_engine_older_than_the_package(empty_db: Callable[[], str]) -> None:
    """An engine function changed in place (a new batonq, no new migration):
    --check's engine_current sees it, and migrate puts the package's back."""
    dsn = empty_db()
    batonq.migrate(dsn)
    reference = snapshot(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE OR REPLACE FUNCTION batonq.sweep() RETURNS integer LANGUAGE sql RETURN 0")
        conn.execute("UPDATE batonq.engine SET sha256 = 'an older engine'")
    assert snapshot(dsn) != reference
    assert pending(dsn) == [] and not engine_current(dsn)
    assert batonq.migrate(dsn) == []
    assert engine_current(dsn)
    assert snapshot(dsn) == reference


# Read by position. Tasks, queue counts and settings are read by name
# (tests/integration/test_task_shape.py checks those).
COMPOSITES = [
    ("batonq.lease", models.Lease),
    ("batonq.submit_reply", models.Submitted),
    ("batonq.enqueued", models.Enqueued),
]


@pytest.mark.parametrize(("type_name", "model"), COMPOSITES, ids=[name for name, _ in COMPOSITES])
def test_composite_types_match_models(sql: psycopg.Connection[Any], type_name: str, model: type[Any]) -> None:
    attributes = [
        name
        for (name,) in sql.execute(
            """SELECT a.attname FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
                WHERE t.oid = %s::regtype AND a.attnum > 0 AND NOT a.attisdropped
                ORDER BY a.attnum""",
            (type_name,),
        )
    ]
    assert attributes
    assert attributes == [f.name for f in dataclasses.fields(model)]


TABLES = ["tasks", "archive", "submits", "idempotency_keys", "queues", "migrations"]


@pytest.mark.parametrize("table", TABLES)
def test_worker_role_has_no_table_access(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            conn.execute(f"SELECT * FROM batonq.{table}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            conn.execute(f"DELETE FROM batonq.{table}")


def test_worker_role_works_through_the_functions(client: batonq.Client, dsn: str) -> None:
    enq = client.enqueue("roles:q", {"n": 1}, idempotency_key="k")
    [lease] = client.claim("roles:q", lease_s=30)
    client.heartbeat(lease.lease_token, stage="s")
    assert client.complete(lease.lease_token, {"ok": True}).outcome == "accepted"
    assert client.task(enq.task_id).state == "done"
    assert client.queues("roles:q")[0].done == 1
    assert client.sweep() == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for operator_call in (
            "SELECT batonq.retry_task(1)",
            "SELECT batonq.configure_queue('roles:q', p_paused => true)",
            "SELECT batonq._queue('roles:q', true)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
                conn.execute(operator_call)


def test_reader_role_reads_but_cannot_write(client: batonq.Client, reader_dsn: str) -> None:
    enq = client.enqueue("roles:q", {"n": 1})
    with batonq.connect(reader_dsn) as reader:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            reader.enqueue("roles:q", {"n": 2})
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            reader.claim("roles:q")
        [stats] = reader.queues("roles:q")
        assert stats.pending == 1
        assert [t.id for t in reader.tasks("roles:q")] == [enq.task_id]
        assert reader.task(enq.task_id).payload == {"n": 1}
    with (
        psycopg.connect(reader_dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"),
    ):
        conn.execute("SELECT * FROM batonq.tasks")
