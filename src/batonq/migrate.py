"""Bring a database's batonq schema up to date: the pending migrations (its
state), then every engine file (its behaviour), together under an advisory lock.

``sql/migrations/NNNN_*.sql`` make tables, indexes, types, roles and grants,
once each, and are never edited once released; ``sql/engine/<concern>.sql``
hold the functions and triggers as ``CREATE OR REPLACE`` and are applied again
on every migrate, in the order of :data:`ENGINE`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

__all__ = [
    "ENGINE",
    "EngineFile",
    "Migration",
    "engine",
    "engine_current",
    "engine_sha256",
    "migrate",
    "migrations",
    "pending",
    "script",
]

# Any 64-bit number works as long as every batonq process agrees on it.
_LOCK_KEY = 0x6261_746F_6E71  # "batonq"

# The engine's files, in the order they are applied: a file's SQL-language
# functions (BEGIN ATOMIC, RETURN) may only call functions of files before it.
ENGINE = (
    "helpers",
    "wake",
    "enqueue",
    "claim",
    "submit",
    "operator",
    "maintenance",
    "leaders",
    "graph",
    "keys",
    "dashboard",
    "audit",
    "schedules",
    "debounce",
)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@dataclass(frozen=True, slots=True)
class EngineFile:
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped with this version of batonq, in order."""
    found = []
    for entry in resources.files("batonq").joinpath("sql", "migrations").iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def engine() -> list[EngineFile]:
    """The engine's files, in the order :func:`migrate` applies them."""
    directory = resources.files("batonq").joinpath("sql", "engine")
    return [EngineFile(n, directory.joinpath(f"{n}.sql").read_text(encoding="utf-8")) for n in ENGINE]


def engine_sha256() -> str:
    """A hash of the engine's files, as batonq.engine records it."""
    digest = hashlib.sha256()
    for file in engine():
        digest.update(file.sql.encode())
    return digest.hexdigest()


def _record_engine() -> str:
    """The statement that records the engine just applied (a hex digest:
    nothing to quote)."""
    return (
        "WITH gone AS (DELETE FROM batonq.engine)\n"
        f"INSERT INTO batonq.engine (sha256) VALUES ('{engine_sha256()}');"
    )


def script() -> str:
    """Every migration and the engine as one transaction, for ``psql -f`` on a
    database without batonq. Each migration records itself in
    batonq.migrations, so a later :func:`migrate` sees it as applied."""
    parts = ["-- batonq schema: every migration, then the engine, all or nothing.", "BEGIN;"]
    parts += [f"\n-- migrations/{m.version:04d}_{m.name}.sql\n{m.sql.rstrip()}" for m in migrations()]
    parts += [f"\n-- engine/{e.name}.sql\n{e.sql.rstrip()}" for e in engine()]
    parts += ["\n-- the engine applied", _record_engine(), "\nCOMMIT;"]
    return "\n".join(parts) + "\n"


def _exists(conn: psycopg.Connection, table: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
    return bool(row and row[0])


def _applied(conn: psycopg.Connection) -> set[int]:
    if not _exists(conn, "batonq.migrations"):
        return set()
    return {v for (v,) in conn.execute("SELECT version FROM batonq.migrations")}


def pending(dsn: str) -> list[Migration]:
    """The migrations this database has not had yet."""
    with psycopg.connect(dsn) as conn:
        done = _applied(conn)
    return [m for m in migrations() if m.version not in done]


def engine_current(dsn: str) -> bool:
    """Whether the database's functions are this version of batonq's engine."""
    with psycopg.connect(dsn) as conn:
        if not _exists(conn, "batonq.engine"):
            return False
        row = conn.execute("SELECT sha256 FROM batonq.engine").fetchone()
    return row is not None and row[0] == engine_sha256()


def migrate(dsn: str) -> list[Migration]:
    """Apply the pending migrations, then every engine file; returns the
    migrations it applied.

    Safe when several processes run it at once: they queue on an advisory
    lock, and all but the first find no migration left to do. All of it
    commits together or not at all.
    """
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        done = _applied(conn)
        todo = [m for m in migrations() if m.version not in done]
        for migration in todo:
            conn.execute(migration.sql.encode(), prepare=False)
        for file in engine():
            conn.execute(file.sql.encode(), prepare=False)
        conn.execute(_record_engine().encode(), prepare=False)
        conn.commit()
    return todo
