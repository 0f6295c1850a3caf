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


@pytest.mark.direct  # a Sweeper's leader lock needs a session: never through a transaction pooler
def test_one_leader_sweeps_and_another_takes_over_when_it_stops(
    client: batonq.Client, dsn: str, sql: psycopg.Connection[Any]
) -> None:
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
        assert advisory_locks(sql, dsn) == 1

        lease_out_and_wait_back(client, task_ids)
        assert (leader.swept, follower.swept) == (3, 0), "only the leader sweeps"
        assert (leader.is_leader, follower.is_leader) == (True, False)

        leader.stop()
        wait_for(lambda: follower.is_leader, timeout=5, what="the other sweeper to take over")
        assert not leader.is_leader, "a stopped sweeper still says it leads"
        assert advisory_locks(sql, dsn) == 1

        lease_out_and_wait_back(client, task_ids)
        assert (leader.swept, follower.swept) == (3, 3)
        assert {client.task(task_id).attempts for task_id in task_ids} == {2}
    finally:
        for sweeper in sweepers:
            sweeper.stop()
    assert wait_for(lambda: advisory_locks(sql, dsn) == 0, timeout=5, what="the lock to go")
