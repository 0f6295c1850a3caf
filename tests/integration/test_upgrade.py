"""Upgrades: a database of an earlier release, after ``batonq migrate``, is the
database a fresh install makes; released migrations are never edited; a
function's signature change needs a migration that drops the old one.

``tests/releases/<version>.sql`` is ``batonq migrate --print-sql`` of each
release, frozen when it was made: the schema a user of that release has."""

from __future__ import annotations

import collections
import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.catalog import functions, snapshot
from tests.conftest import scratch_database

import batonq
from batonq.migrate import engine, migrations

RELEASES = sorted(Path(__file__).resolve().parents[1].joinpath("releases").glob("*.sql"))
_CREATE = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION (batonq\.\w+)\(", re.M)
_DROP = re.compile(r"^DROP FUNCTION (?:IF EXISTS )?(batonq\.\w+)\(", re.M)


@pytest.fixture
def empty_db(server_dsn: str) -> Iterator[Callable[[], str]]:
    """Makes empty databases; drops them afterwards."""
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(scratch_database(server_dsn, "batonq_u"))


def _run(dsn: str, *scripts: str) -> None:
    """Each script as psql -f would run it, in order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in scripts:
            conn.execute(sql.encode(), prepare=False)


def _in_one_transaction(*scripts: str) -> str:
    return "BEGIN;\n" + "\n".join(scripts) + "\nCOMMIT;\n"


def _defined() -> collections.Counter[str]:
    """Functions by name, as many as the shipped SQL files make (one per
    CREATE): the migrations' less those they drop, then the engine's (applied
    after the migrations, so a function a migration drops for a new
    signature is made again)."""
    made = collections.Counter(name for m in migrations() for name in _CREATE.findall(m.sql))
    made.subtract(name for m in migrations() for name in _DROP.findall(m.sql))
    return +made + collections.Counter(name for e in engine() for name in _CREATE.findall(e.sql))


def _by_name(signatures: set[str]) -> collections.Counter[str]:
    return collections.Counter(signature.split("(")[0] for signature in signatures)


def test_there_is_a_release_to_upgrade_from() -> None:
    assert RELEASES, "each release freezes its batonq migrate --print-sql as tests/releases/<version>.sql"


@pytest.mark.parametrize("release", RELEASES, ids=[r.stem for r in RELEASES])
def test_released_migrations_are_never_edited(release: Path) -> None:
    frozen = release.read_text(encoding="utf-8")
    released = {int(v) for v in re.findall(r"^-- migrations/(\d{4})_\w+\.sql$", frozen, re.M)}
    assert released
    for migration in migrations():
        if migration.version in released:
            assert migration.sql.rstrip() in frozen, (
                f"migrations/{migration.version:04d}_{migration.name}.sql changed after release "
                f"{release.stem}: put the change in a new migration"
            )


@pytest.mark.parametrize("release", RELEASES, ids=[r.stem for r in RELEASES])
def test_an_upgraded_database_equals_a_fresh_one(empty_db: Callable[[], str], release: Path) -> None:
    """A user's database of an earlier release, migrated, has the same
    tables, columns, indexes, constraints, functions (signatures, settings,
    grants, definitions), triggers, views, types and grants as a fresh one."""
    upgraded, fresh = empty_db(), empty_db()
    _run(upgraded, release.read_text(encoding="utf-8"))
    batonq.migrate(upgraded)
    batonq.migrate(fresh)
    assert snapshot(upgraded) == snapshot(fresh)
    assert _by_name(functions(upgraded)) == _defined()


def test_after_migrate_the_functions_are_those_the_files_define(empty_db: Callable[[], str]) -> None:
    dsn = empty_db()
    batonq.migrate(dsn)
    assert _by_name(functions(dsn)) == _defined()
    assert len(_defined()) > 20


def test_a_signature_change_needs_a_migration_that_drops_the_old_function(
    empty_db: Callable[[], str],
) -> None:
    """CREATE OR REPLACE with new arguments makes a second function beside the
    old one: the upgraded database keeps a stale overload (and calls that fit
    both become ambiguous) until a migration drops it."""
    old = "FUNCTION batonq._state_of(p_task_id bigint) RETURNS text"
    new = "FUNCTION batonq._state_of(p_task_id bigint, p_queue text DEFAULT NULL) RETURNS text"
    changed = [e.sql.replace(old, new) for e in engine()]
    assert changed != [e.sql for e in engine()], "the function to change is where the test expects it"
    schema = [m.sql for m in migrations()]
    previous = RELEASES[-1].read_text(encoding="utf-8")
    drop = "DROP FUNCTION batonq._state_of(bigint);"
    # The migrations since that release, which the engine's files may need.
    since = [m.sql for m in migrations() if f"-- migrations/{m.version:04d}_{m.name}.sql" not in previous]

    fresh, without_drop, with_drop = empty_db(), empty_db(), empty_db()
    _run(fresh, _in_one_transaction(*schema, *changed))
    _run(without_drop, previous, _in_one_transaction(*since, *changed))
    _run(with_drop, previous, _in_one_transaction(*since, drop, *changed))

    stale = functions(without_drop) - functions(fresh)
    assert stale == {"batonq._state_of(bigint)"}
    assert snapshot(without_drop) != snapshot(fresh)
    assert _by_name(functions(without_drop))["batonq._state_of"] == 2
    assert snapshot(with_drop) == snapshot(fresh)


def test_a_join_that_died_before_the_upgrade_comes_back_with_its_element(
    empty_db: Callable[[], str],
) -> None:
    """0.1.0 marked a join resolved when an element killed it, and stopped
    counting its elements: once migrated, retrying that element brings the
    join back, and it gathers every element in order."""
    dsn = empty_db()
    _run(dsn, (RELEASES[0].parent / "0.1.0.sql").read_text(encoding="utf-8"))
    with psycopg.connect(dsn, autocommit=True) as conn:

        def claim(queue: str) -> dict[Any, str]:
            rows = conn.execute("SELECT row, lease_token FROM batonq.claim(%s, p_max_tasks => 3)", (queue,))
            return {row: token for row, token in rows.fetchall()}

        conn.execute("SELECT batonq.add_edge('split', 'work', p_fan_out => '')")
        conn.execute("SELECT batonq.add_edge('work', 'gather', p_is_join => true)")
        conn.execute("SELECT batonq.enqueue('split', 'null')")
        [token] = claim("split").values()
        conn.execute("SELECT batonq.complete(%s, '[1, 2, 3]')", (token,))
        work = claim("work")
        conn.execute("SELECT batonq.fail(%s, '\"broke\"', p_requeue => false)", (work[2],))
        conn.execute("SELECT batonq.complete(%s, '10')", (work[1],))
        conn.execute("SELECT batonq.complete(%s, '30')", (work[3],))
        [(dead,)] = conn.execute("SELECT id FROM batonq.archive WHERE queue = 'work' AND state = 'dead'")

    batonq.migrate(dsn)

    with batonq.connect(dsn) as client:
        client.retry(dead)
        [again] = client.claim("work")
        client.complete(again.lease_token, 20)
        [joined] = client.claim("gather")
        assert joined.row == [10, 20, 30]
