"""Heartbeats: a handler that outlives its lease keeps it; a handler whose
lease is stolen learns of it, and its late result is refused and recorded."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from tests.worker.support import eventually_async, leased

import batonq


async def test_heartbeats_keep_a_lease_the_handler_outlives(
    client: batonq.Client, aclient: batonq.AsyncClient, sql: psycopg.Connection[Any], dsn: str
) -> None:
    app = batonq.App()

    @app.task("hb:sync", lease_s=2)
    def long_sync(job: batonq.Job) -> str:
        time.sleep(5)
        return "sync survived"

    @app.task("hb:async", lease_s=2)
    async def long_async(job: batonq.AsyncJob) -> str:
        await asyncio.sleep(5)
        return "async survived"

    ids = [client.enqueue("hb:sync", {}).task_id, client.enqueue("hb:async", {}).task_id]
    running = asyncio.create_task(
        batonq.Worker(app, dsn=dsn, handle_signals=False, wait_s=0.5, burst=True).run_async()
    )
    await eventually_async(lambda: asyncio.to_thread(leased, sql), timeout=10, what="both claimed")
    # Meanwhile another claimer keeps trying: with the leases alive, it never
    # gets either task (each claim also expires overdue leases first).
    stolen: list[batonq.Lease] = []
    while not running.done():
        for queue in ("hb:sync", "hb:async"):
            stolen += await aclient.claim(queue, lease_s=60)
        await asyncio.wait([running], timeout=0.25)
    assert await running == 0
    assert stolen == []
    for task_id, result in zip(ids, ["sync survived", "async survived"], strict=True):
        task = client.task(task_id)
        assert (task.state, task.result, task.attempts, task.errors) == ("done", result, 1, [])


def _steal(sql: psycopg.Connection[Any], queue: str) -> tuple[int, int, str]:
    """Expire the lease in the database and claim the task as a thief, in one
    transaction (so the worker's next heartbeat cannot take it back first)."""
    with sql.transaction():
        sql.execute(
            "UPDATE batonq.tasks SET lease_expires_at = now() - interval '1 s' WHERE queue = %s", (queue,)
        )
        row = sql.execute(
            "SELECT task_id, fencing_token, lease_token FROM batonq.claim(%s, 'thief', 1, 60)", (queue,)
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _ledger(sql: psycopg.Connection[Any], task_id: int) -> list[tuple[Any, ...]]:
    return sql.execute(
        "SELECT fencing_token, kind, outcome FROM batonq.submits WHERE task_id = %s ORDER BY at",
        (task_id,),
    ).fetchall()


class Outcomes(batonq.Middleware):
    def __init__(self) -> None:
        self.seen: list[batonq.Outcome] = []

    def after_job(self, job: batonq.BaseJob, outcome: batonq.Outcome) -> None:
        self.seen.append(outcome)


async def test_sync_handler_learns_its_lease_was_stolen_and_its_result_is_refused(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str
) -> None:
    started = threading.Event()
    noticed: list[bool] = []
    outcomes = Outcomes()
    app = batonq.App(middleware=[outcomes])

    @app.task("steal:sync", lease_s=3)
    def slow(job: batonq.Job) -> dict[str, str]:
        started.set()
        noticed.append(job.lease_lost.wait(30))
        return {"by": "worker"}

    enq = client.enqueue("steal:sync", {})
    running = asyncio.create_task(
        batonq.Worker(app, dsn=dsn, handle_signals=False, wait_s=0.5, burst=True).run_async()
    )
    assert await asyncio.to_thread(started.wait, 10)
    [worker_token] = [t for (t,) in sql.execute("SELECT fencing_token FROM batonq.tasks").fetchall()]
    task_id, thief_token, thief_lease = await asyncio.to_thread(_steal, sql, "steal:sync")
    assert task_id == enq.task_id and thief_token > worker_token

    assert await asyncio.wait_for(running, 20) == 0
    assert noticed == [True]
    [outcome] = outcomes.seen
    assert (outcome.status, outcome.result) == ("lease_lost", {"by": "worker"})
    ledger = _ledger(sql, task_id)
    assert (worker_token, "heartbeat", "set_aside") in ledger
    assert (worker_token, "complete", "set_aside") in ledger
    assert not [row for row in ledger if row[0] == worker_token and row[2] == "accepted"]

    # The thief's work is what counts.
    assert client.complete(thief_lease, {"by": "thief"}).outcome == "accepted"
    task = client.task(task_id)
    assert (task.state, task.result) == ("done", {"by": "thief"})


async def test_async_handler_is_cancelled_when_its_lease_is_stolen(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    outcomes = Outcomes()
    app = batonq.App(middleware=[outcomes])

    @app.task("steal:async", lease_s=3)
    async def slow(job: batonq.AsyncJob) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            assert job.lease_lost.is_set()
            cancelled.set()
            raise
        return "too late"

    enq = client.enqueue("steal:async", {})
    running = asyncio.create_task(
        batonq.Worker(app, dsn=dsn, handle_signals=False, wait_s=0.5, burst=True).run_async()
    )
    await asyncio.wait_for(started.wait(), 10)
    [worker_token] = [t for (t,) in sql.execute("SELECT fencing_token FROM batonq.tasks").fetchall()]
    task_id, _, thief_lease = await asyncio.to_thread(_steal, sql, "steal:async")

    await asyncio.wait_for(cancelled.wait(), 10)
    assert await asyncio.wait_for(running, 20) == 0
    assert [o.status for o in outcomes.seen] == ["lease_lost"]
    ledger = _ledger(sql, task_id)
    assert (worker_token, "heartbeat", "set_aside") in ledger
    assert not [row for row in ledger if row[0] == worker_token and row[1] in ("complete", "fail")]
    assert client.complete(thief_lease, "thief").outcome == "accepted"
    assert client.task(enq.task_id).result == "thief"


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_set_stage_on_a_lost_lease_raises_and_flags(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, kind: str
) -> None:
    """A handler that reports progress hears of a stolen lease from set_stage
    too, without waiting for the next heartbeat."""
    raised: list[str] = []
    stolen = threading.Event()
    app = batonq.App()

    def sync_handler(job: batonq.Job) -> None:
        job.set_stage("one")
        stolen.wait(10)
        try:
            job.set_stage("two")
        except batonq.LeaseLost as lost:
            raised.append(f"{lost.state} {job.lease_lost.is_set()}")
            raise

    async def async_handler(job: batonq.AsyncJob) -> None:
        await job.set_stage("one")
        await asyncio.to_thread(stolen.wait, 10)
        try:
            await job.set_stage("two")
        except batonq.LeaseLost as lost:
            raised.append(f"{lost.state} {job.lease_lost.is_set()}")
            raise

    app.add_task("stage:q", sync_handler if kind == "sync" else async_handler, lease_s=600)
    client.enqueue("stage:q", {})
    running = asyncio.create_task(
        batonq.Worker(app, dsn=dsn, handle_signals=False, wait_s=0.5, burst=True).run_async()
    )

    def staged() -> bool:
        row = sql.execute("SELECT stage FROM batonq.tasks").fetchone()
        return row is not None and row[0] == "one"

    await eventually_async(lambda: asyncio.to_thread(staged), timeout=10, what="stage one")
    task_id, _, thief_lease = await asyncio.to_thread(_steal, sql, "stage:q")
    stolen.set()
    assert await asyncio.wait_for(running, 20) == 0
    assert raised == ["leased True"]
    assert client.complete(thief_lease, "thief").outcome == "accepted"
    assert client.task(task_id).result == "thief"
