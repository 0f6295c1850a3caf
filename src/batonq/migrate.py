"""Bring a database's batonq schema up to date: the pending migrations (its
state), then every engine file (its behaviour), together under an advisory lock.

``sql/migrations/NNNN_*.sql`` make tables, indexes, types, roles and grants,
once each, and are never edited once released; ``sql/engine/<concern>.sql``
hold the functions and triggers as ``CREATE OR REPLACE`` and are applied again
on every migrate, in the order of :data:`ENGINE`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

__all__ = ["ENGINE", "EngineFile", "Migration", "engine", "migrate", "migrations", "pending", "script"]

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


def script() -> str:
    """Every migration and the engine as one transaction, for ``psql -f`` on a
    database without batonq. Each migration records itself in
    batonq.migrations, so a later :func:`migrate` sees it as applied."""
    parts = ["-- batonq schema: every migration, then the engine, all or nothing.", "BEGIN;"]
    parts += [f"\n-- migrations/{m.version:04d}_{m.name}.sql\n{m.sql.rstrip()}" for m in migrations()]
    parts += [f"\n-- engine/{e.name}.sql\n{e.sql.rstrip()}" for e in engine()]
    parts.append("\nCOMMIT;")
    return "\n".join(parts) + "\n"


def _applied(conn: psycopg.Connection) -> set[int]:
    row = conn.execute("SELECT to_regclass('batonq.migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return set()
    return {v for (v,) in conn.execute("SELECT version FROM batonq.migrations")}


def pending(dsn: str) -> list[Migration]:
    """The migrations this database has not had yet."""
    with psycopg.connect(dsn) as conn:
        done = _applied(conn)
    return [m for m in migrations() if m.version not in done]


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
        conn.commit()
    return todo
