"""One holder and exactly-once acceptance under real concurrency: eight OS
processes draining one queue, and eight connections racing one idempotency key."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from tests.proc_worker import Worker

import batonq

Q = "shop:tasks"
N_TASKS = 5_000
N_PROCS = 8
T = TypeVar("T")


@pytest.mark.parametrize("batch", [1, 50])
def test_eight_processes_complete_every_task_exactly_once(
    batch: int, client: batonq.Client, dsn: str, sql: psycopg.Connection[Any]
) -> None:
    enqueued = client.enqueue_many(Q, [{"n": n} for n in range(N_TASKS)])
    task_ids = {e.task_id for e in enqueued}
    assert len(task_ids) == N_TASKS

    with contextlib.ExitStack() as stack:
        workers = [
            stack.enter_context(Worker("drain", dsn, Q, str(batch), f"proc-{i}")) for i in range(N_PROCS)
        ]
        for worker in workers:  # every process connected: let them loose together
            assert worker.read_line(timeout=30) == "ready"
        started = time.monotonic()
        for worker in workers:
            worker.send("go")
        reports = [json.loads(worker.read_line(timeout=120)) for worker in workers]
        assert [worker.wait(timeout=10) for worker in workers] == [0] * N_PROCS
        elapsed = time.monotonic() - started

    # Every lease any process held: (task_id, fencing_token, process).
    leases = [(task_id, token, r["name"]) for r in reports for task_id, token in r["held"]]
    tokens = Counter(token for _, token, _ in leases)
    assert [t for t, n in tokens.items() if n > 1] == [], "a fencing token was handed out twice"
    holders = Counter((task_id, token) for task_id, token, _ in leases)
    assert [k for k, n in holders.items() if n > 1] == [], "two processes held one task under one token"
    # No lease expired (default 300 s), so each task had exactly one holder.
    claims = Counter(task_id for task_id, _, _ in leases)
    assert set(claims) == task_ids and set(claims.values()) == {1}
    assert [r["refused"] for r in reports] == [[]] * N_PROCS
    # The work was shared: this was a race, not one process doing it all.
    assert sum(1 for r in reports if r["held"]) >= 2, [len(r["held"]) for r in reports]

    # The ledger: nothing refused, nothing replayed.
    assert sql.execute("SELECT count(*) FROM batonq.submits WHERE queue = %s", (Q,)).fetchone() == (0,)

    # The archive: 5,000 done rows, each accepted under its one lease and
    # by the process that held it.
    archived = sql.execute(
        "SELECT id, state, fencing_token, worker, result FROM batonq.archive WHERE queue = %s", (Q,)
    ).fetchall()
    assert len(archived) == N_TASKS
    assert {state for _, state, _, _, _ in archived} == {"done"}
    assert {(task_id, token) for task_id, _, token, _, _ in archived} == set(holders)
    by_lease = {(task_id, token): name for task_id, token, name in leases}
    assert all(by_lease[(i, tok)] == worker == result["by"] for i, _, tok, worker, result in archived)
    # Nothing left behind.
    assert sql.execute("SELECT count(*) FROM batonq.tasks").fetchone() == (0,)
    [stats] = client.queues(Q)
    assert (stats.pending, stats.leased, stats.done) == (0, 0, N_TASKS)
    print(f"batch {batch}: {N_TASKS} tasks by {N_PROCS} processes in {elapsed:.2f} s")


def _race(clients: list[batonq.Client], call: Callable[[batonq.Client, int], T]) -> list[T]:
    """Run ``call(client, i)`` on every client at the same moment."""
    barrier = threading.Barrier(len(clients))
    results: list[T | None] = [None] * len(clients)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = call(clients[i], i)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


@pytest.fixture
def eight_clients(dsn: str) -> Iterator[list[batonq.Client]]:
    """Eight clients, each on its own single connection, opened up front."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(batonq.connect(dsn, min_connections=1, max_connections=1, listen=False))
            for _ in range(N_PROCS)
        ]


def test_same_key_from_eight_connections_makes_one_task(
    eight_clients: list[batonq.Client], sql: psycopg.Connection[Any]
) -> None:
    for round_ in range(5):
        key = f"shard-{round_:02d}"
        answers = _race(eight_clients, lambda c, i: c.enqueue(Q, {"from": i}, idempotency_key=key))  # noqa: B023
        assert sum(a.created for a in answers) == 1
        [task_id] = {a.task_id for a in answers}
        assert {a.state for a in answers} == {"pending"}
        winner = next(i for i, a in enumerate(answers) if a.created)
        assert eight_clients[0].task(task_id).payload == {"from": winner}
    rows = sql.execute("SELECT idempotency_key, count(*) FROM batonq.tasks GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [(f"shard-{r:02d}", 1) for r in range(5)]


def test_same_keys_through_enqueue_many_from_eight_connections(
    eight_clients: list[batonq.Client], sql: psycopg.Connection[Any]
) -> None:
    keys = [f"shard-{k:02d}" for k in range(40)]
    for round_ in range(3):
        orders = [random.Random(round_ * 100 + i).sample(keys, len(keys)) for i in range(N_PROCS)]

        def batch(c: batonq.Client, i: int) -> list[batonq.Enqueued]:
            # Each connection sends the keys in its own order, one key twice.
            mine = [*orders[i], orders[i][0]]  # noqa: B023
            return c.enqueue_many(f"q{round_}", [{"key": k, "from": i} for k in mine], idempotency_keys=mine)  # noqa: B023

        answers = _race(eight_clients, batch)
        by_key: dict[str, set[int]] = {}
        created: Counter[str] = Counter()
        for i, replies in enumerate(answers):
            assert len(replies) == len(keys) + 1
            assert replies[-1].task_id == replies[0].task_id and not replies[-1].created
            for key, reply in zip([*orders[i], orders[i][0]], replies, strict=True):
                by_key.setdefault(key, set()).add(reply.task_id)
                created[key] += reply.created
        assert all(len(ids) == 1 for ids in by_key.values()), "one key, more than one task"
        assert created == dict.fromkeys(keys, 1), "one key, not exactly one created=True"
        rows = sql.execute(
            "SELECT idempotency_key, id FROM batonq.tasks WHERE queue = %s", (f"q{round_}",)
        ).fetchall()
        assert sorted(rows) == sorted((k, next(iter(by_key[k]))) for k in keys)
