"""The sweeper: of the sweepers on one database exactly one leads; it returns
the expired leases of queues nobody claims from; when it stops, another leads."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from tests.waiting import wait_for

import batonq
from batonq.sweeper import _VACUUM_DUE as VACUUM_DUE

Q = "idle:queue"  # nobody claims from it once its leases are out
LEASE_S = 1
BACK_WITHIN_S = LEASE_S + 2


def advisory_locks(sql: psycopg.Connection[Any], dsn: str) -> int:
    row = sql.execute(
        """SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
            WHERE l.locktype = 'advisory' AND l.granted AND d.datname = %s""",
        (conninfo_to_dict(dsn)["dbname"],),
    ).fetchone()
    assert row is not None
    return int(row[0])


def lease_holder(sql: psycopg.Connection[Any], duty: str = "sweeper") -> tuple[str, int] | None:
    """(holder, fencing token) of the unexpired lease on ``duty``, if any."""
    row = sql.execute(
        "SELECT holder, token FROM batonq.leaders WHERE duty = %s AND expires_at > now()", (duty,)
    ).fetchone()
    return (str(row[0]), int(row[1])) if row else None


def lease_out_and_wait_back(client: batonq.Client, task_ids: set[int]) -> None:
    """Lease every task for LEASE_S, then wait (no claim) until all are pending."""
    leases = client.claim(Q, max_tasks=len(task_ids), lease_s=LEASE_S)
    claimed = time.monotonic()
    assert {lease.task_id for lease in leases} == task_ids

    def all_pending() -> bool:
        return all(client.task(task_id).state == "pending" for task_id in task_ids)

    wait_for(all_pending, timeout=BACK_WITHIN_S + 5, what="expired leases to return to pending")
    took = time.monotonic() - claimed
    # (took starts after the claim's transaction, whose clock the lease runs on)
    assert LEASE_S - 0.2 <= took < BACK_WITHIN_S, f"back after {took:.2f} s for a {LEASE_S} s lease"
    assert {client.task(task_id).last_error for task_id in task_ids} == {"lease expired"}


def test_one_leader_sweeps_and_another_takes_over_when_it_stops(
    client: batonq.Client, dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """Through PgBouncer too (the pooled pass): the lease is a row, and no
    sweeper leaves a lock on a server connection."""
    task_ids = {e.task_id for e in client.enqueue_many(Q, [{"n": n} for n in range(3)])}
    sweepers = [batonq.Sweeper(dsn, interval_s=0.2), batonq.Sweeper(dsn, interval_s=0.2)]
    for sweeper in sweepers:
        sweeper.start()
    try:
        leader = wait_for(
            lambda: next((s for s in sweepers if s.is_leader), None), timeout=5, what="a leader"
        )
        [follower] = [s for s in sweepers if s is not leader]
        assert not follower.is_leader
        assert lease_holder(sql) == (leader.holder, leader.token)

        lease_out_and_wait_back(client, task_ids)
        assert (leader.swept, follower.swept) == (3, 0), "only the leader sweeps"
        assert (leader.is_leader, follower.is_leader) == (True, False)

        first_term = leader.token
        assert first_term is not None
        leader.stop()
        wait_for(lambda: follower.is_leader, timeout=5, what="the other sweeper to take over")
        assert not leader.is_leader, "a stopped sweeper still says it leads"
        assert lease_holder(sql) == (follower.holder, first_term + 1), "the next term, the next token"

        lease_out_and_wait_back(client, task_ids)
        assert (leader.swept, follower.swept) == (3, 3)
        assert {client.task(task_id).attempts for task_id in task_ids} == {2}
    finally:
        for sweeper in sweepers:
            sweeper.stop()
    assert lease_holder(sql) is None, "a stopped sweeper gives its lease up"
    assert advisory_locks(sql, dsn) == 0


def test_a_dead_leaders_lease_runs_out_and_a_standby_takes_over(
    dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """A leader that vanished without giving its lease up (killed, or cut
    off) is replaced once its lease has run out, not before."""
    sql.execute(
        "INSERT INTO batonq.leaders VALUES ('sweeper', 'gone:1:x', 7, now(), now() + interval '2 s')"
    )
    standby = batonq.Sweeper(dsn, interval_s=0.1, lease_s=1)
    standby.start()
    try:
        time.sleep(1)  # well within the dead leader's lease
        assert not standby.is_leader
        wait_for(lambda: standby.is_leader, timeout=5, what="the standby to take over")
        assert standby.token == 8
    finally:
        standby.stop()


def hot_partition_stats(sql: psycopg.Connection[Any], queue: str) -> tuple[int, int]:
    """(dead row versions, vacuums so far) of the hot partition ``queue`` lives in."""
    row = sql.execute(
        """SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables
            WHERE relid = (SELECT tableoid FROM batonq.tasks WHERE queue = %s LIMIT 1)""",
        (queue,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_sweeper_that_owns_the_tables_vacuums_a_hot_partition_full_of_dead_rows(
    admin_dsn: str, dsn: str, sql: psycopg.Connection[Any]
) -> None:
    queue = "busy:queue"
    sql.execute("SELECT batonq.enqueue_many(%s, array_fill('{}'::jsonb, ARRAY[501]))", (queue,))
    # 500 claimed and completed: a moved row and a deleted row each.
    tokens = [t for (t,) in sql.execute("SELECT lease_token FROM batonq.claim(%s, 'w', 500)", (queue,))]
    sql.execute("SELECT count(*) FROM batonq.complete_many(%s)", (tokens,))
    sql.execute("SELECT pg_stat_force_next_flush()")
    sql.execute("SELECT 1")
    dead, vacuums = hot_partition_stats(sql, queue)
    assert dead >= 1000

    # The worker role owns nothing: its sweeper leaves vacuum to the owner.
    for who, due in ((dsn, 0), (admin_dsn, 1)):
        with psycopg.connect(who) as conn:
            assert len(conn.execute(VACUUM_DUE, (1000,)).fetchall()) == due, who

    # A worker's sweeper leads (it came first); the owner's vacuums all the same.
    worker_side = batonq.Sweeper(dsn, interval_s=0.1, vacuum_dead=1000)
    owner_side = batonq.Sweeper(admin_dsn, interval_s=0.1, vacuum_dead=1000)
    worker_side.start()
    try:
        wait_for(lambda: worker_side.is_leader, timeout=10, what="the worker's sweeper to lead")
        owner_side.start()
        wait_for(lambda: owner_side.vacuums, timeout=10, what="a vacuum")
        assert not owner_side.is_leader and worker_side.vacuums == 0
    finally:
        owner_side.stop()
        worker_side.stop()
    dead_after, _ = wait_for(
        lambda: (s := hot_partition_stats(sql, queue))[1] > vacuums and s, timeout=15, what="the stats"
    )
    assert dead_after < 1000


def test_the_sweeper_keeps_maintaining_while_retention_is_behind(admin_dsn: str, sql: Any) -> None:
    """Retention removes 10,000 rows per maintenance; with more due, the
    sweeper maintains again at its next tick instead of a minute later."""
    with batonq.connect(admin_dsn) as admin:
        admin.configure_queue("ret:busy", retention_s=60)
    sql.execute(
        """INSERT INTO batonq.archive (id, queue, state, priority, run_at, created_at, payload, attempts,
                                       max_attempts, root_id, errors, finished_at)
           SELECT n, 'ret:busy', 'done', 0, now(), now(), '1', 1, 3, n, '[]', now() - interval '1 hour'
             FROM generate_series(1, 25000) n"""
    )
    sweeper = batonq.Sweeper(admin_dsn, interval_s=0.1, maintain_every_s=3600)
    sweeper.start()
    try:
        wait_for(
            lambda: sql.execute("SELECT count(*) FROM batonq.archive").fetchone()[0] == 0,
            timeout=20,
            what="retention to catch up",
        )
    finally:
        sweeper.stop()


@pytest.mark.direct  # the blocking lock is held on a connection of its own
def test_stop_cancels_a_statement_that_runs_long(
    dsn: str, admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """A sweep stuck behind a lock (or a long VACUUM) does not hold up stop()."""
    with psycopg.connect(admin_dsn) as blocker:
        blocker.execute("LOCK TABLE batonq.tasks IN ACCESS EXCLUSIVE MODE")
        sweeper = batonq.Sweeper(dsn, interval_s=0.2)
        sweeper.start()
        thread = sweeper._thread
        assert thread is not None

        def sweeper_waits() -> bool:
            row = sql.execute(
                """SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock'"""
            ).fetchone()
            return bool(row and row[0])

        wait_for(sweeper_waits, timeout=10, what="the sweeper to wait on the lock")
        started = time.monotonic()
        sweeper.stop()
        took = time.monotonic() - started
        assert not thread.is_alive(), "the sweeper's thread still runs"
        assert took < 5, f"stop() took {took:.1f} s"
        blocker.rollback()


def test_a_sweeper_that_owns_the_tables_analyzes_a_hot_partition_after_a_bulk_load(
    admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """1,500 tasks loaded and never analyzed: the owner's sweeper analyzes
    their partition once it changed by analyze_changed rows, and not again
    until it changes as much again."""
    queue = "bulk:queue"
    sql.execute("SELECT batonq.enqueue_many(%s, array_fill('{}'::jsonb, ARRAY[1500]))", (queue,))
    sql.execute("SELECT pg_stat_force_next_flush()")

    def analyzed() -> int:
        row = sql.execute(
            """SELECT analyze_count FROM pg_stat_user_tables
                WHERE relid = (SELECT tableoid FROM batonq.tasks WHERE queue = %s LIMIT 1)""",
            (queue,),
        ).fetchone()
        assert row is not None
        return int(row[0])

    assert analyzed() == 0
    sweeper = batonq.Sweeper(admin_dsn, interval_s=0.1, vacuum_dead=0, analyze_changed=1000)
    sweeper.start()
    try:
        wait_for(lambda: sweeper.analyzes, timeout=10, what="an analyze")
        wait_for(lambda: analyzed() == 1, timeout=15, what="the stats")
        time.sleep(0.5)  # several ticks: nothing changed since
        assert sweeper.analyzes == 1
    finally:
        sweeper.stop()


def test_a_sweeper_that_owns_the_tables_vacuums_the_group_lease_deltas(
    admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """600 grouped tasks claimed and completed leave 1,200 delta rows; the
    sweep folds them into the counts, and the vacuum removes what is left."""
    queue = "grouped:queue"
    sql.execute(
        "SELECT batonq.enqueue_many(%s, array_fill('{}'::jsonb, ARRAY[600]),"
        " p_groups => ARRAY(SELECT 'g' || (i %% 7) FROM generate_series(1, 600) i))",
        (queue,),
    )
    tokens = [t for (t,) in sql.execute("SELECT lease_token FROM batonq.claim(%s, 'w', 600)", (queue,))]
    sql.execute("SELECT count(*) FROM batonq.complete_many(%s)", (tokens,))

    def vacuumed() -> int:
        row = sql.execute(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'batonq.group_lease_deltas'::regclass"
        ).fetchone()
        assert row is not None
        return int(row[0])

    assert vacuumed() == 0
    sweeper = batonq.Sweeper(admin_dsn, interval_s=0.1, vacuum_dead=1000, analyze_changed=0)
    sweeper.start()
    try:
        wait_for(lambda: vacuumed() > 0, timeout=15, what="a vacuum of the deltas")
    finally:
        sweeper.stop()
    assert sql.execute("SELECT count(*) FROM batonq.group_lease_deltas").fetchone() == (0,)
    assert sql.execute("SELECT count(*) FROM batonq.group_leases").fetchone() == (0,)
