"""The hot paths' plans under generic plans, with a crowd of other tasks.

PL/pgSQL caches a generic plan per statement and session, so that is the
plan a busy worker runs. With 100,000 finished tasks and 100,000 pending
tasks of other queues present, a claim and a complete must each touch one
partition of batonq.tasks (the queue's), by index, and read a handful of
rows: their cost may not grow with other queues' backlogs or the archive.

auto_explain captures the plan of every statement inside the functions, as
they actually ran (log_analyze), and hands them to us as NOTICEs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import batonq

# auto_explain is a contrib module: the machine's server has it, pgserver does not.
pytestmark = pytest.mark.needs_auto_explain

Q = "plans:q"
OTHER_QUEUES = 10
PER_QUEUE = 10_000
ARCHIVED = 100_000
PARTITIONS = 16
HOT = ("tasks", "archive")
INDEX_SCANS = ("Index Scan", "Index Only Scan")

Plan = dict[str, Any]


def remainder(sql: psycopg.Connection[Any], queue: str) -> int:
    """The hash partition of batonq.tasks that ``queue`` lives in."""
    for r in range(PARTITIONS):
        row = sql.execute(
            "SELECT satisfies_hash_partition('batonq.tasks'::regclass, %s, %s, %s::text)",
            (PARTITIONS, r, queue),
        ).fetchone()
        if row and row[0]:
            return r
    raise AssertionError(f"{queue} is in no partition")


def other_queues(sql: psycopg.Connection[Any]) -> list[str]:
    """Other queues, the first of them sharing Q's partition, so the claim
    has to tell Q's tasks from another queue's in the same table."""
    mine = remainder(sql, Q)
    names = [f"other:{i}" for i in range(200)]
    neighbour = next(n for n in names if remainder(sql, n) == mine)
    return [neighbour, *[n for n in names if n != neighbour][: OTHER_QUEUES - 1]]


@pytest.fixture
def crowded(admin: batonq.Client, sql: psycopg.Connection[Any]) -> str:
    """The database full of other work; returns Q's partition's name."""
    others = other_queues(sql)
    for queue in others:
        admin.enqueue_many(queue, [{"i": i} for i in range(PER_QUEUE)])
    sql.execute(
        """INSERT INTO batonq.archive (id, queue, state, priority, run_at, created_at, payload,
                                       attempts, max_attempts, root_id, fencing_token, errors,
                                       result, finished_at)
           SELECT n, q.queues[1 + n %% cardinality(q.queues)], 'done', 0, now(), now(), '{}',
                  1, 3, n, n, '[]', '{}', now() - make_interval(secs => n %% 3600)
             FROM (SELECT nextval('batonq.task_id_seq') AS n FROM generate_series(1, %s)) g,
                  (SELECT %s::text[] AS queues) q""",
        (ARCHIVED, [*others, Q]),
    )
    admin.enqueue_many(Q, [{"mine": i} for i in range(200)], max_attempts=1000)
    sql.execute("ANALYZE batonq.tasks")
    sql.execute("ANALYZE batonq.archive")
    counts = dict(
        sql.execute(
            """SELECT t.queue = %s, count(*) FROM batonq.tasks t
                WHERE t.tableoid = (SELECT tableoid FROM batonq.tasks WHERE queue = %s LIMIT 1)
                GROUP BY 1""",
            (Q, Q),
        ).fetchall()
    )
    assert counts == {True: 200, False: PER_QUEUE}, "a neighbour queue shares Q's partition"
    row = sql.execute(
        "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM batonq.archive"
    ).fetchone()
    assert row == (ARCHIVED, ARCHIVED)
    row = sql.execute("SELECT count(*) FROM batonq.tasks WHERE queue <> %s", (Q,)).fetchone()
    assert row == (OTHER_QUEUES * PER_QUEUE,)
    part = sql.execute(
        "SELECT tableoid::regclass::text FROM batonq.tasks WHERE queue = %s LIMIT 1", (Q,)
    ).fetchone()
    assert part is not None
    return str(part[0]).removeprefix("batonq.")


def nodes(plan: Plan) -> Iterator[Plan]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


class Explained:
    """A connection whose functions' inner statements are explained."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.captured: list[tuple[str, Plan]] = []
        conn.add_notice_handler(self._notice)
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET plan_cache_mode = force_generic_plan")

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if "plan:" in message:
            doc = json.loads(message.split("plan:", 1)[1])
            self.captured.append((doc["Query Text"], doc["Plan"]))

    def explain(self, on: bool) -> None:
        settings = {
            "log_min_duration": "0" if on else "-1",
            "log_nested_statements": "on",
            "log_analyze": "on",
            "log_format": "json",
            "log_level": "notice",
        }
        for name, value in settings.items():
            self.conn.execute(f"SET auto_explain.{name} = '{value}'")
        self.captured.clear()


def scans(captured: list[tuple[str, Plan]]) -> list[tuple[str, Plan]]:
    """Every scan of a tasks or archive partition that actually ran."""
    found = []
    for text, plan in captured:
        for node in nodes(plan):
            relation = node.get("Relation Name", "")
            ran = node.get("Actual Loops", 0) > 0
            if ran and node["Node Type"] != "ModifyTable" and relation.startswith(HOT):
                found.append((text, node))
    return found


def check_plans(captured: list[tuple[str, Plan]], partition: str, max_rows: int) -> list[Plan]:
    assert captured, "auto_explain captured nothing"
    for text, plan in captured:
        for node in nodes(plan):
            relation = node.get("Relation Name", "")
            if relation.startswith(HOT) and node.get("Actual Loops", 0) > 0:
                assert node["Node Type"] != "Seq Scan", f"seq scan of {relation} in:\n{text}"
            assert node["Node Type"] != "Hash Join" or node.get("Actual Loops", 0) == 0, text
    ran = scans(captured)
    for text, node in ran:
        where = f"{node['Node Type']} on {node['Relation Name']} in:\n{text}"
        assert node["Relation Name"] == partition, f"touches another partition: {where}"
        assert node["Node Type"] in INDEX_SCANS, f"not an index scan: {where}"
    read = sum(
        node["Actual Rows"] * node["Actual Loops"]
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
        for _, node in ran
    )
    assert read <= max_rows, f"read {read} rows: {json.dumps([n for _, n in ran], indent=1)}"
    return [node for _, node in ran]


def expire_my_leases(sql: psycopg.Connection[Any]) -> None:
    sql.execute(
        "UPDATE batonq.tasks SET lease_expires_at = now() - interval '1 second'"
        " WHERE queue = %s AND state = 'leased'",
        (Q,),
    )


def claim_round(conn: psycopg.Connection[Any], max_tasks: int) -> list[str]:
    rows = conn.execute(
        "SELECT lease_token FROM batonq.claim(%s, 'plans', %s, 60)", (Q, max_tasks)
    ).fetchall()
    assert len(rows) == max_tasks
    return [token for (token,) in rows]


def measure(
    conn: psycopg.Connection[Any], sql: psycopg.Connection[Any], max_tasks: int
) -> tuple[list[tuple[str, Plan]], list[tuple[str, Plan]]]:
    """The plans of one claim of ``max_tasks`` and one complete, as they ran."""
    explained = Explained(conn)
    explained.explain(False)
    # Each round leaves leases behind that run out before the next claim,
    # so the claim first expires them (those statements run too); then one
    # lease is completed. Seven rounds warm PL/pgSQL's plan cache.
    for _ in range(7):
        claim_round(conn, 1)
        expire_my_leases(sql)
        tokens = claim_round(conn, max_tasks)
        conn.execute("SELECT * FROM batonq.complete_in(%s, %s, '{}')", (Q, tokens[0]))

    claim_round(conn, 1)
    expire_my_leases(sql)
    explained.explain(True)
    tokens = claim_round(conn, max_tasks)
    claim_plans = list(explained.captured)
    explained.explain(True)
    [(outcome,)] = conn.execute(
        "SELECT outcome FROM batonq.complete_in(%s, %s, '{}')", (Q, tokens[0])
    ).fetchall()
    complete_plans = list(explained.captured)
    explained.explain(False)
    assert outcome == "accepted"
    return claim_plans, complete_plans


def pruned_at_run_time(captured: list[tuple[str, Plan]]) -> bool:
    """A generic plan over every partition, cut to one as it ran."""
    return any(node.get("Subplans Removed") == PARTITIONS - 1 for _, plan in captured for node in nodes(plan))


def test_claim_and_complete_plans_stay_in_one_partition(
    crowded: str, admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    for max_tasks in (1, 10):
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            claim_plans, complete_plans = measure(conn, sql, max_tasks)

        texts = "\n".join(text for text, _ in claim_plans)
        assert "FOR UPDATE SKIP LOCKED" in texts and "UPDATE batonq.tasks" in texts
        ran = check_plans(claim_plans, crowded, max_rows=8 * max_tasks + 10)
        # The expiry's lookup, update and delete, the pick and the claim's
        # update each read the queue's partition.
        assert len(ran) >= 5
        assert pruned_at_run_time(claim_plans)

        assert any("DELETE FROM batonq.tasks" in text for text, _ in complete_plans)
        ran = check_plans(complete_plans, crowded, max_rows=5)
        assert len(ran) >= 1
        assert pruned_at_run_time(complete_plans)


def test_claims_with_limits_stay_in_one_partition_by_index(
    crowded: str, admin: batonq.Client, admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """Every limit on (none of them reached): the claim also counts the
    queue's leases, reads the groups' lease counts and rate buckets, walks the
    claim index past full groups and takes the groups' tokens; all of it by
    index in the queue's partition, reading about as much as the claim
    without limits."""
    sql.execute("UPDATE batonq.tasks SET group_key = 'customer-' || (id %% 20) WHERE queue = %s", (Q,))
    sql.execute("ANALYZE batonq.tasks")
    admin.configure_queue(
        Q, max_leased=1000, group_max_leased=5, rate_limit=100_000, group_rate_limit=100_000
    )
    for max_tasks in (1, 10):
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            claim_plans, complete_plans = measure(conn, sql, max_tasks)

        texts = "\n".join(text for text, _ in claim_plans)
        assert "state = 'leased'" in texts and "group_leases" in texts and "rate_buckets" in texts
        assert "group_rate_buckets" in texts
        check_plans(claim_plans, crowded, max_rows=12 * max_tasks + 20)
        assert pruned_at_run_time(claim_plans)
        check_plans(complete_plans, crowded, max_rows=5)


def test_a_page_of_queues_reads_its_settings_and_schedules_by_index(
    admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """MCP's batonq_queues reads the settings and schedules of its page's
    queues alone: their cost does not grow with the number of queues."""
    sql.execute("INSERT INTO batonq.queues (name) SELECT 'many:' || n FROM generate_series(1, 5000) n")
    sql.execute(
        """INSERT INTO batonq.schedules (name, cron, tz, queue, payload, missed)
           SELECT 'every-' || n, '0 * * * *', 'UTC', 'many:' || n, '{}', 'skip'
             FROM generate_series(1, 5000) n"""
    )
    sql.execute("ANALYZE batonq.queues, batonq.schedules")
    page = ["many:4000", "many:7"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        explained = Explained(conn)
        for function, expected in (("list_queues", page), ("list_schedules", ["every-4000", "every-7"])):
            explained.explain(True)
            found = [name for (name,) in conn.execute(f"SELECT name FROM batonq.{function}(%s)", (page,))]
            ran = [n for _, plan in explained.captured for n in nodes(plan) if n.get("Actual Loops")]
            explained.explain(False)
            assert found == expected
            assert ran, f"no plan of {function} captured"
            assert not [n for n in ran if n["Node Type"] == "Seq Scan"], function
