"""Queue stats count finished tasks as they move, not by reading the archive:
exact under concurrent moves, and free of the archive's size."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable
from typing import Any

import psycopg

import batonq

QUEUES = ("stats:a", "stats:b")
THREADS = 6
ROUNDS = 40


def real_counts(sql: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    rows = sql.execute(
        "SELECT state, count(*) FROM batonq.archive WHERE queue = %s GROUP BY state", (queue,)
    ).fetchall()
    return {"done": 0, "dead": 0, "cancelled": 0} | {state: int(n) for state, n in rows}


def reported(client: batonq.Client, queue: str) -> dict[str, int]:
    [stats] = client.queues(queue)
    return {"done": stats.done, "dead": stats.dead, "cancelled": stats.cancelled}


def finish(client: batonq.Client, lease: batonq.Lease, roll: float) -> None:
    """Complete it, or fail it for good, or fail it to be run again."""
    with contextlib.suppress(batonq.LeaseLost):  # the operator may have cancelled it
        if roll < 0.7:
            client.complete(lease.lease_token, "one")
        elif roll < 0.85:
            client.fail(lease.lease_token, "bad", requeue=False)
        else:
            client.fail(lease.lease_token, "again", retry_delay_s=0)


def work(dsn: str, seed: int, start: threading.Barrier) -> None:
    rng = random.Random(seed)
    with batonq.connect(dsn, listen=False) as client:
        start.wait()
        for _ in range(ROUNDS):
            queue = rng.choice(QUEUES)
            client.enqueue_many(queue, [{"seed": seed}] * rng.randint(1, 20))
            batch = []
            for lease in client.claim(queue, max_tasks=rng.randint(1, 15)):
                roll = rng.random()
                if roll < 0.6:
                    batch.append((lease.lease_token, "ok"))
                else:
                    finish(client, lease, roll)
            if batch:
                client.complete_many(batch)


def operate(admin: batonq.Client, start: threading.Barrier) -> None:
    """Cancels, retries and folds the counts while the others work."""
    rng = random.Random(0)
    start.wait()
    for round_ in range(ROUNDS):
        for task in admin.tasks(rng.choice(QUEUES), state="pending", limit=3):
            with contextlib.suppress(batonq.InvalidState):  # claimed meanwhile
                admin.cancel(task.id)
        for task in admin.tasks(rng.choice(QUEUES), state="dead", limit=2):
            admin.retry(task.id)
        if round_ % 10 == 0:
            admin.maintain()


def test_counts_match_the_archive_after_a_concurrent_run(
    dsn: str, admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    for queue in QUEUES:
        admin.configure_queue(queue, max_attempts=2, backoff_base_s=0)
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(target: Callable[..., None], *args: Any) -> None:
        try:
            target(*args)
        except BaseException as error:
            errors.append(error)
            start.abort()
            raise

    threads = [threading.Thread(target=run, args=(work, dsn, seed, start)) for seed in range(THREADS - 1)]
    threads.append(threading.Thread(target=run, args=(operate, admin, start)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []

    for queue in QUEUES:
        real = real_counts(sql, queue)
        assert all(real.values()), real  # every kind of move happened
        assert reported(admin, queue) == real
    admin.maintain()  # folded, the same
    for queue in QUEUES:
        assert reported(admin, queue) == real_counts(sql, queue)
    rows = sql.execute("SELECT count(*) FROM batonq.finished_counts").fetchone()
    assert rows is not None and rows[0] <= len(QUEUES) * 3


def test_counts_follow_retention_and_truncate(admin: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    admin.configure_queue("stats:short", retention_s=86400)
    for n in range(3):
        admin.enqueue("stats:short", n)
        [lease] = admin.claim("stats:short")
        admin.complete(lease.lease_token)
    # One finished 40 days ago: its day's partition is dropped whole.
    sql.execute("SELECT batonq.ensure_partitions((now() AT TIME ZONE 'UTC')::date - 40, 1)")
    sql.execute(
        "UPDATE batonq.archive SET finished_at = now() - interval '40 days'"
        " WHERE id = (SELECT min(id) FROM batonq.archive WHERE queue = 'stats:short')"
    )
    assert reported(admin, "stats:short")["done"] == 3

    report = admin.maintain()

    assert report["partitions_dropped"] >= 1
    assert (
        reported(admin, "stats:short")
        == real_counts(sql, "stats:short")
        == {"done": 2, "dead": 0, "cancelled": 0}
    )
    sql.execute("TRUNCATE batonq.archive")
    assert reported(admin, "stats:short")["done"] == 0


def test_stats_read_no_archive_partition(admin: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    for n in range(5):
        admin.enqueue("stats:c", n)
        [lease] = admin.claim("stats:c")
        admin.complete(lease.lease_token)
    with sql.transaction():
        [row] = sql.execute("SELECT done FROM batonq.queue_stats('stats:c')").fetchall()
        assert row == (5,)
        scans = sql.execute(
            "SELECT relname FROM pg_stat_xact_user_tables WHERE schemaname = 'batonq'"
            " AND relname LIKE 'archive%%' AND seq_scan + coalesce(idx_scan, 0) > 0"
        ).fetchall()
    assert scans == []
