"""Retention: finished tasks older than their queue's retention go, whole day
partitions at a time where every queue agrees, row by row otherwise; keys and
ledger rows go with them, and nothing live is touched."""

from __future__ import annotations

from typing import Any

import psycopg

import batonq


def finish_days_ago(sql: psycopg.Connection[Any], task_id: int, days: int) -> None:
    """Move a finished task (and its ledger rows) ``days`` back in time."""
    sql.execute("SELECT batonq.ensure_partitions((now() AT TIME ZONE 'UTC')::date - %s, 1)", (days,))
    sql.execute(
        """WITH moved AS (DELETE FROM batonq.archive WHERE id = %(id)s RETURNING *)
           INSERT INTO batonq.archive SELECT id, queue, state, priority, run_at, created_at, payload,
                  attempts, max_attempts, idempotency_key, parent_id, root_id, fencing_token, claimed_at,
                  worker, stage, last_error, errors, join_task_id, fan_index, result,
                  finished_at - make_interval(days => %(d)s), lease_secret, claim_key FROM moved""",
        {"id": task_id, "d": days},
    )
    sql.execute(
        """WITH moved AS (DELETE FROM batonq.submits WHERE task_id = %(id)s RETURNING *)
           INSERT INTO batonq.submits SELECT task_id, queue, fencing_token, kind, outcome, state_after,
                  body, at - make_interval(days => %(d)s) FROM moved""",
        {"id": task_id, "d": days},
    )
    sql.execute(
        "UPDATE batonq.idempotency_keys SET created_at = created_at - make_interval(days => %s)"
        " WHERE task_id = %s",
        (days, task_id),
    )


def done(client: batonq.Client, queue: str, key: str) -> int:
    """A finished task with a row in the submit ledger (a replayed complete)."""
    task = client.enqueue(queue, {"k": key}, idempotency_key=key)
    [lease] = client.claim(queue)
    client.complete(lease.lease_token, "ok")
    assert client.complete(lease.lease_token, "ok").replayed
    return task.task_id


def partitions(sql: psycopg.Connection[Any], table: str = "batonq.archive") -> set[str]:
    rows = sql.execute(
        """SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = %s::regclass""",
        (table,),
    ).fetchall()
    return {name for (name,) in rows}


def day_ago(sql: psycopg.Connection[Any], days: int) -> str:
    """The suffix of the day partitions of ``days`` ago (``YYYYMMDD``)."""
    row = sql.execute("SELECT to_char((now() AT TIME ZONE 'UTC')::date - %s, 'YYYYMMDD')", (days,)).fetchone()
    assert row is not None
    return str(row[0])


def test_retention_drops_old_days_and_keeps_the_rest(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    admin.configure_queue("short", retention_s=86400)  # one day
    admin.configure_queue("long", retention_s=30 * 86400)  # thirty days
    old_short = done(client, "short", "a")
    new_short = done(client, "short", "b")
    old_long = done(client, "long", "c")
    ancient = done(client, "long", "d")
    live = client.enqueue("short", "still pending", idempotency_key="e")
    finish_days_ago(sql, old_short, 3)
    finish_days_ago(sql, old_long, 3)
    finish_days_ago(sql, ancient, 40)
    (old_day,) = sql.execute(
        "SELECT 'archive_' || to_char((now() AT TIME ZONE 'UTC')::date - 40, 'YYYYMMDD')"
    ).fetchone() or ("",)
    assert old_day in partitions(sql)

    report = client.maintain()

    assert report["partitions_dropped"] >= 2  # the 40-day-old archive and submits days
    remaining = {t for (t,) in sql.execute("SELECT id FROM batonq.archive").fetchall()}
    # short keeps a day: its 3-day-old task goes row by row; long keeps 30 days.
    assert remaining == {new_short, old_long}
    assert old_day not in partitions(sql) and "archive_default" in partitions(sql)
    assert client.task(live.task_id).state == "pending"
    keys = {k for (k,) in sql.execute("SELECT key FROM batonq.idempotency_keys").fetchall()}
    assert keys == {"b", "c", "e"}
    ledger = {t for (t,) in sql.execute("SELECT DISTINCT task_id FROM batonq.submits").fetchall()}
    assert ledger == {new_short, old_long}
    # A retained key still answers with its task; a dropped one is free again.
    assert not client.enqueue("long", 1, idempotency_key="c").created
    assert client.enqueue("short", 1, idempotency_key="a").created


def test_retention_prunes_debounce_windows_whose_task_finished(
    client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    window = {"debounce_s": 0.01, "max_wait_s": 60}
    finished = client.enqueue("digest", {"n": 1}, debounce_key="user-1", **window)
    [lease] = client.claim("digest", wait_s=5)
    client.complete(lease.lease_token)
    open_ = client.enqueue("digest", {"n": 2}, debounce_key="user-2", debounce_s=60)
    claimed = client.enqueue("digest", {"n": 3}, debounce_key="user-3", **window)
    [held] = client.claim("digest", wait_s=5)
    assert (lease.task_id, held.task_id) == (finished.task_id, claimed.task_id)

    report = client.maintain()

    assert report["debounces_deleted"] == 1
    windows = sql.execute("SELECT key, task_id FROM batonq.debounces ORDER BY key").fetchall()
    # The finished task's window goes; an open one and a leased task's stay.
    assert windows == [("user-2", open_.task_id), ("user-3", claimed.task_id)]
    # The key enqueues again as a new window.
    again = client.enqueue("digest", {"n": 4}, debounce_key="user-1", debounce_s=60)
    assert again.created and again.task_id != finished.task_id
    assert client.maintain()["debounces_deleted"] == 0


def test_retention_keeps_the_elements_a_waiting_join_needs(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    admin.add_edge("split", "work", fan_out="")
    admin.add_edge("work", "gather", join=True)
    admin.configure_queue("work", retention_s=0)
    client.enqueue("split", None)
    [lease] = client.claim("split")
    client.complete(lease.lease_token, [1, 2, 3])
    leases = sorted(client.claim("work", max_tasks=3), key=lambda lease: lease.row)
    for lease in leases[:2]:
        client.complete(lease.lease_token, lease.row * 10)

    assert client.maintain()["archived_deleted"] == 0

    client.complete(leases[2].lease_token, 30)
    [joined] = client.claim("gather")
    assert joined.row == [10, 20, 30]
    # Gathered: the elements are free to go.
    assert client.maintain()["archived_deleted"] == 3
    [stats] = client.queues("work")
    assert stats.done == 0


def test_retention_keeps_an_old_day_that_a_waiting_join_needs(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    admin.add_edge("split", "work", fan_out="")
    admin.add_edge("work", "gather", join=True)
    for queue in ("split", "work", "gather"):
        admin.configure_queue(queue, retention_s=86400)
    client.enqueue("split", None)
    [lease] = client.claim("split")
    client.complete(lease.lease_token, [1, 2])
    first, second = sorted(client.claim("work", max_tasks=2), key=lambda lease: lease.row)
    client.complete(first.lease_token, 10)
    finish_days_ago(sql, first.task_id, 3)
    finish_days_ago(sql, lease.task_id, 3)  # the split task, same old day

    old = day_ago(sql, 3)
    assert {f"archive_{old}", f"submits_{old}"} <= partitions(sql) | partitions(sql, "batonq.submits")
    report = client.maintain()
    # The archive's day stays (its ledger's day goes); the split task goes row by row.
    # (Named, not counted: past days' empty partitions go too, and how many
    # there are depends on whether a midnight passed since the database was made.)
    assert f"archive_{old}" in partitions(sql) and f"submits_{old}" not in partitions(sql, "batonq.submits")
    assert report["partitions_dropped"] >= 1 and report["archived_deleted"] == 1

    client.complete(second.lease_token, 20)
    [joined] = client.claim("gather")
    assert joined.row == [10, 20]
    client.maintain()
    assert f"archive_{old}" not in partitions(sql)
