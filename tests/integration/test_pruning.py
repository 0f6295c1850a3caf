"""Every engine operation on a queue touches one hash partition of the hot
table: the queue's. That is what lets a distributed database (Citus, by
queue) route each call to one shard. The hot tables and their partitions are
read from the catalog; auto_explain shows each inner statement as it ran,
under generic plans (pruned at run time)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from tests.integration.test_plans import Explained, nodes

import batonq

pytestmark = pytest.mark.needs_auto_explain

Q = "prune:q"
NEIGHBOURS = [f"prune:other{i}" for i in range(20)]
INSERT_ONLY = ("enqueue", "enqueue_many", "await_work")  # they route a row, or scan no hot table
WARM = 6  # PL/pgSQL switches to its cached generic plan after five runs

HASH_PARTITIONS = """
    SELECT i.inhrelid::regclass::text, p.partrelid::regclass::text
      FROM pg_partitioned_table p JOIN pg_inherits i ON i.inhparent = p.partrelid
     WHERE p.partstrat = 'h' AND p.partrelid::regclass::text LIKE 'batonq.%'"""


def hot_partitions(sql: psycopg.Connection[Any]) -> dict[str, str]:
    """Partition name (without schema) -> its hash-partitioned parent."""
    rows = sql.execute(HASH_PARTITIONS).fetchall()
    assert rows, "no hash-partitioned table in the batonq schema"
    return {child.removeprefix("batonq."): parent for child, parent in rows}


def touched(explained: Explained, partitions: dict[str, str]) -> set[str]:
    """The hot partitions any statement scanned or changed as it ran."""
    names = set()
    for _, plan in explained.captured:
        for node in nodes(plan):
            relation = node.get("Relation Name", "")
            if relation in partitions and node.get("Actual Loops", 1) > 0:
                names.add(relation)
    return names


def test_each_operation_touches_only_its_queues_partition(
    client: batonq.Client, sql: psycopg.Connection[Any], admin_dsn: str
) -> None:
    partitions = hot_partitions(sql)
    for queue in NEIGHBOURS:
        client.enqueue_many(queue, [{"n": n} for n in range(5)])
    client.enqueue_many(Q, [{"n": n} for n in range(200)])
    mine: set[str] = set()
    for parent in set(partitions.values()):
        for (part,) in sql.execute(
            f"SELECT DISTINCT tableoid::regclass::text FROM {parent} WHERE queue = %s", (Q,)
        ).fetchall():
            mine.add(str(part).removeprefix("batonq."))
    assert len(mine) == 1
    others = {
        str(part).removeprefix("batonq.")
        for (part,) in sql.execute(
            "SELECT DISTINCT tableoid::regclass::text FROM batonq.tasks WHERE queue <> %s", (Q,)
        ).fetchall()
    }
    assert others - mine, "the other queues live in other partitions"

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        explained = Explained(conn)

        def token() -> str:
            row = conn.execute("SELECT lease_token FROM batonq.claim(%s, 'prune', 1, 60)", (Q,)).fetchone()
            assert row is not None
            return str(row[0])

        operations: dict[str, Callable[[], object]] = {
            "enqueue": lambda: conn.execute("SELECT * FROM batonq.enqueue(%s, '{}')", (Q,)),
            "enqueue_many": lambda: conn.execute(
                "SELECT * FROM batonq.enqueue_many(%s, ARRAY['{}', '{}']::jsonb[])", (Q,)
            ),
            "claim": token,
            # The forms the clients call, queue first (batonq.operations).
            "heartbeat": lambda: conn.execute("SELECT * FROM batonq.heartbeat_in(%s, %s)", (Q, token())),
            "complete": lambda: conn.execute("SELECT * FROM batonq.complete_in(%s, %s, '{}')", (Q, token())),
            "complete_many": lambda: conn.execute(
                "SELECT * FROM batonq.complete_many_in(%s, %s::text[], ARRAY['{}', '{}']::jsonb[])",
                (Q, [token(), token()]),
            ),
            "fail": lambda: conn.execute("SELECT * FROM batonq.fail_in(%s, %s, '{}')", (Q, token())),
            "release_lease": lambda: conn.execute(
                "SELECT * FROM batonq.release_lease_in(%s, %s)", (Q, token())
            ),
            # The token-only forms, for SQL callers, run the same statements.
            "complete (token only)": lambda: conn.execute(
                "SELECT * FROM batonq.complete(%s, '{}')", (token(),)
            ),
            "complete_many (token only)": lambda: conn.execute(
                "SELECT * FROM batonq.complete_many(%s::text[], ARRAY['{}', '{}']::jsonb[])",
                ([token(), token()],),
            ),
            "await_work": lambda: conn.execute("SELECT batonq.await_work(%s, 10)", (Q,)),
        }
        for name, operation in operations.items():
            explained.explain(False)
            for _ in range(WARM):
                operation()
            explained.explain(True)
            operation()
            seen = touched(explained, partitions)
            assert seen <= mine, f"{name} touched {sorted(seen - mine)} besides {sorted(mine)}"
            if name not in INSERT_ONLY:
                assert seen == mine, f"{name} did not read its queue's partition"
            explained.explain(False)
