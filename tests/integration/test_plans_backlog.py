"""The hot statements read about their batch on a deep backlog, whether or
not the tables were ever analyzed.

A new database that takes a bulk load and drains it at once has no
statistics (autovacuum off, or not yet run); with none, the planner may pick
a partial index of one state by queue and filter the ids a statement looks
for, reading the queue's whole backlog on every call. Every statement here
runs as the engine's functions run it (generic plans, PL/pgSQL's cache),
explained by auto_explain, on 100,000 pending tasks of one queue: first never
analyzed, then after ANALYZE.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from tests.integration.test_plans import Explained, nodes

import batonq

pytestmark = pytest.mark.needs_auto_explain

Q = "backlog:q"
BACKLOG = 100_000
BATCH = 100
GROUPS = 1_000


def load(sql: psycopg.Connection[Any], queue: str, n: int, *, groups: int | None = None) -> None:
    """n pending tasks of ``queue`` in one statement, as a bulk load leaves
    them (no ANALYZE)."""
    sql.execute(
        """INSERT INTO batonq.tasks (id, queue, state, run_at, payload, max_attempts, root_id, group_key)
           SELECT g.n, %s, 'pending', now() - interval '1 minute', '{}', 1000, g.n,
                  CASE WHEN %s::integer IS NOT NULL THEN 'g-' || g.n %% %s::integer END
             FROM (SELECT nextval('batonq.task_id_seq') AS n FROM generate_series(1, %s)) g""",
        (queue, groups, groups, n),
    )


def read_per_call(conn: psycopg.Connection[Any], call: Callable[[], Any]) -> tuple[int, list[str]]:
    """Rows the call's statements read from batonq.tasks (returned, and
    removed by a filter), with a line per statement for a failure's message."""
    explained = Explained(conn)
    explained.explain(True)
    try:
        call()
    finally:
        captured = list(explained.captured)
        explained.explain(False)
    total, lines = 0, []
    for text, plan in captured:
        read = 0
        for node in nodes(plan):
            if node.get("Relation Name", "").startswith("tasks") and node["Node Type"] != "ModifyTable":
                read += node.get("Actual Rows", 0) * node.get("Actual Loops", 0)
                read += node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
        total += read
        if read:
            lines.append(f"{read} rows: {' '.join(text.split())[:160]}")
    return total, lines


def check(conn: psycopg.Connection[Any], what: str, call: Callable[[], Any], batch: int) -> None:
    read, lines = read_per_call(conn, call)
    limit = 6 * batch + 20
    assert read <= limit, f"{what} read {read} rows (> {limit}):\n" + "\n".join(lines)


def tokens(conn: psycopg.Connection[Any], n: int) -> list[str]:
    rows = conn.execute("SELECT lease_token FROM batonq.claim(%s, 'plans', %s, 60)", (Q, n)).fetchall()
    assert len(rows) == n
    return [t for (t,) in rows]


def exercise(dsn: str, sql: psycopg.Connection[Any]) -> None:
    """Every hot statement once, each checked; one session, so the plans
    are the ones PL/pgSQL cached for it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")

        def run(statement: str, *params: Any) -> Callable[[], Any]:
            return lambda: conn.execute(statement, params).fetchall()

        # Plans are cached at the first call: warm them, then measure.
        for _ in range(2):
            leases = tokens(conn, BATCH)
            run("SELECT count(*) FROM batonq.complete_many_in(%s, %s)", Q, leases)()

        check(conn, "claim", lambda: tokens(conn, BATCH), BATCH)
        leases = tokens(conn, BATCH)
        many_in = "SELECT count(*) FROM batonq.complete_many_in(%s, %s)"
        check(conn, "complete_many", run(many_in, Q, leases[:50]), 50)
        check(conn, "complete", run("SELECT batonq.complete_in(%s, %s)", Q, leases[50]), 1)
        check(conn, "heartbeat", run("SELECT batonq.heartbeat_in(%s, %s)", Q, leases[51]), 1)
        check(conn, "fail", run("SELECT batonq.fail_in(%s, %s, '\"x\"', 60)", Q, leases[52]), 1)
        check(
            conn, "fail (dead)", run("SELECT batonq.fail_in(%s, %s, '\"x\"', NULL, false)", Q, leases[53]), 1
        )
        check(conn, "release", run("SELECT batonq.release_lease_in(%s, %s)", Q, leases[54]), 1)
        check(conn, "enqueue", run("SELECT batonq.enqueue(%s, '{}')", Q), 1)
        many = "SELECT count(*) FROM batonq.enqueue_many(%s, array_fill('{}'::jsonb, ARRAY[%s]), %s)"
        check(conn, "enqueue_many", run(many, Q, BATCH, None), BATCH)
        keys = [f"k{i}" for i in range(BATCH)]
        check(conn, "enqueue_many with keys", run(many, Q, BATCH, keys), BATCH)

        # The leases left run out: the next claim expires them first (its
        # batch: those and its own), and the sweep those that no claim takes.
        expired = expire(sql)
        check(conn, "claim expiring leases", lambda: tokens(conn, BATCH), BATCH + expired)
        expired = expire(sql)
        check(conn, "sweep", run("SELECT batonq.sweep()"), expired)


def expire(sql: psycopg.Connection[Any]) -> int:
    """Run out the queue's leases; returns how many."""
    cur = sql.execute(
        "UPDATE batonq.tasks SET lease_expires_at = now() - interval '1 s'"
        " WHERE queue = %s AND state = 'leased'",
        (Q,),
    )
    return cur.rowcount


@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed"])
def test_hot_statements_read_their_batch_on_a_deep_backlog(
    analyzed: bool, admin: batonq.Client, admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    admin.configure_queue(Q)
    load(sql, Q, BACKLOG)
    if analyzed:
        sql.execute("ANALYZE batonq.tasks")
    exercise(admin_dsn, sql)


@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed"])
def test_limited_claims_read_their_batch_on_a_deep_backlog(
    analyzed: bool, admin: batonq.Client, admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """Every limit on, none reached: the claim counts the queue's leases,
    looks up the groups' counts and buckets, and takes the groups' tokens."""
    admin.configure_queue(
        Q, max_leased=1_000_000, group_max_leased=5, rate_limit=1_000_000_000, group_rate_limit=1_000_000
    )
    load(sql, Q, BACKLOG, groups=GROUPS)
    if analyzed:
        sql.execute("ANALYZE batonq.tasks")
    exercise(admin_dsn, sql)


FULL_GROUPS = 10_000


@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed"])
def test_a_claim_past_many_full_groups_reads_the_tasks_ahead_once(
    analyzed: bool, admin: batonq.Client, admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """group_max_leased 1 and 10,000 full groups, each with a lease and a
    task waiting ahead of other groups' tasks: the first claim reads the
    tasks ahead once, by the claim index, and sets them aside; the next
    claims read their batch. A lease that ends gives its group's task back."""
    admin.configure_queue(Q, group_max_leased=1)
    sql.execute(
        """INSERT INTO batonq.tasks (id, queue, state, run_at, payload, max_attempts, root_id, group_key,
                                     attempts, fencing_token, lease_secret, lease_expires_at)
           SELECT g.n, %s, 'leased', now() - interval '1 hour', '{}', 3, g.n, 'full-' || g.i,
                  1, g.n, gen_random_uuid(), now() + interval '1 hour'
             FROM (SELECT i, nextval('batonq.task_id_seq') AS n FROM generate_series(1, %s) i) g""",
        (Q, FULL_GROUPS),
    )
    sql.execute(
        """INSERT INTO batonq.tasks (id, queue, state, run_at, payload, max_attempts, root_id, group_key)
           SELECT g.n, %s, 'pending', now() - interval '1 hour' + g.i * interval '1 ms', '{}', 3, g.n,
                  CASE WHEN g.i <= %s THEN 'full-' || g.i ELSE 'free-' || g.i END
             FROM (SELECT i, nextval('batonq.task_id_seq') AS n FROM generate_series(1, %s) i) g""",
        (Q, FULL_GROUPS, FULL_GROUPS + 3),
    )
    if analyzed:
        sql.execute("ANALYZE batonq.tasks")
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        claimed: list[str] = []

        def claim() -> None:
            claimed.extend(g for (g,) in conn.execute("""SELECT "group" FROM batonq.claim(%s)""", (Q,)))

        read, lines = read_per_call(conn, claim)
        assert claimed == [f"free-{FULL_GROUPS + 1}"]
        # The walk, then the update that sets them aside by id.
        assert read <= 2 * FULL_GROUPS + 20, f"read {read} rows:\n" + "\n".join(lines)
        for n in (2, 3):
            read, lines = read_per_call(conn, claim)
            assert claimed[-1] == f"free-{FULL_GROUPS + n}"
            assert read <= 20, f"read {read} rows:\n" + "\n".join(lines)
        [(token,)] = sql.execute(
            "SELECT batonq._lease_token(queue, id, fencing_token, lease_secret) FROM batonq.tasks"
            " WHERE queue = %s AND group_key = 'full-7000' AND state = 'leased'",
            (Q,),
        ).fetchall()
        assert admin.complete(token).outcome == "accepted"
        read, lines = read_per_call(conn, claim)
        assert claimed[-1] == "full-7000"
        assert read <= 20, f"read {read} rows:\n" + "\n".join(lines)
