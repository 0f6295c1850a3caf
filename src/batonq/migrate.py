"""Apply the engine's numbered SQL migrations, once, under an advisory lock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

__all__ = ["Migration", "migrate", "migrations", "pending"]

# Any 64-bit number works as long as every batonq process agrees on it.
_LOCK_KEY = 0x6261_746F_6E71  # "batonq"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped with this version of batonq, in order."""
    found = []
    for entry in resources.files("batonq").joinpath("sql").iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


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
    """Bring the database's batonq schema up to date; returns what it applied.

    Safe when several processes run it at once: they queue on an advisory
    lock, and all but the first find nothing left to do. All of it commits
    together or not at all.
    """
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        done = _applied(conn)
        todo = [m for m in migrations() if m.version not in done]
        for migration in todo:
            conn.execute(migration.sql.encode(), prepare=False)
        conn.commit()
    return todo
