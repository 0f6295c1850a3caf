"""The worker in this process: handlers' results, errors and retries, the
Job handle, middleware, --burst and --max-tasks."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any

import psycopg
import pytest
from tests.worker.support import eventually_async, states

import batonq


def worker(app: batonq.App, dsn: str, **options: Any) -> batonq.Worker:
    options.setdefault("wait_s", 0.5)
    return batonq.Worker(app, dsn=dsn, handle_signals=False, **options)


async def test_2000_tasks_across_3_queues_each_result_lands_once(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str
) -> None:
    app = batonq.App()
    calls: dict[int, int] = {}
    lock = threading.Lock()

    def count(job: batonq.BaseJob) -> None:
        with lock:
            calls[job.id] = calls.get(job.id, 0) + 1

    @app.task("mix:sync")
    def double(job: batonq.Job) -> dict[str, Any]:
        count(job)
        return {"i": job.payload["i"], "double": job.payload["i"] * 2}

    @app.task("mix:async")
    async def square(job: batonq.AsyncJob) -> dict[str, Any]:
        count(job)
        await asyncio.sleep(0)
        return {"i": job.payload["i"], "square": job.payload["i"] ** 2}

    @app.task("mix:slow")
    def slowly(job: batonq.Job) -> int:
        count(job)
        time.sleep(0.001)
        return int(job.payload["i"])

    for queue, size in (("mix:sync", 800), ("mix:async", 800), ("mix:slow", 400)):
        client.enqueue_many(queue, [{"i": i} for i in range(size)])
    payloads = dict(sql.execute("SELECT id, payload FROM batonq.tasks").fetchall())
    queues = dict(sql.execute("SELECT id, queue FROM batonq.tasks").fetchall())
    assert len(payloads) == 2000

    started = time.monotonic()
    code = await worker(app, dsn, concurrency=16, burst=True).run_async()
    elapsed = time.monotonic() - started
    assert code == 0, elapsed

    done = dict(sql.execute("SELECT id, result FROM batonq.archive WHERE state = 'done'").fetchall())
    assert set(done) == set(payloads)
    for task_id, result in done.items():
        i = payloads[task_id]["i"]
        want = {"mix:sync": {"i": i, "double": 2 * i}, "mix:async": {"i": i, "square": i * i}, "mix:slow": i}
        assert result == want[queues[task_id]]
    # One accepted complete per task: one archive row each, and no refused
    # or replayed write in the ledger.
    assert sql.execute("SELECT count(*), count(DISTINCT id) FROM batonq.archive").fetchone() == (2000, 2000)
    assert sql.execute("SELECT count(*) FROM batonq.submits").fetchone() == (0,)
    assert calls == dict.fromkeys(payloads, 1)


async def test_permanent_error_is_dead_after_one_attempt(
    client: batonq.Client, dsn: str
) -> None:
    app = batonq.App()

    @app.task("err:perm")
    def refuse(job: batonq.Job) -> None:
        raise batonq.PermanentError(f"order {job.payload['order']} does not exist")

    enq = client.enqueue("err:perm", {"order": 17})
    assert await worker(app, dsn, burst=True).run_async() == 0
    task = client.task(enq.task_id)
    assert (task.state, task.attempts, task.max_attempts) == ("dead", 1, 3)
    assert task.last_error is not None
    assert "PermanentError: order 17 does not exist" in task.last_error
    assert "Traceback (most recent call last)" in task.last_error


async def test_retry_waits_its_delay(client: batonq.Client, dsn: str) -> None:
    app = batonq.App()

    @app.task("err:retry")
    async def flaky(job: batonq.AsyncJob) -> dict[str, int]:
        if job.attempt == 1:
            raise batonq.Retry(delay_s=1.5, message="rate limited")
        return {"attempt": job.attempt}

    enq = client.enqueue("err:retry", {})
    runner = worker(app, dsn, wait_s=0.2)
    running = asyncio.create_task(runner.run_async())

    async def finished() -> batonq.Task | None:
        task = await asyncio.to_thread(client.task, enq.task_id)
        return task if task.state == "done" else None

    task = await eventually_async(finished, timeout=15, what="the retried task is done")
    runner.stop()
    assert await running == 0
    assert task.result == {"attempt": 2} and task.attempts == 2
    [first] = task.errors
    assert first["error"] == "Retry: rate limited"
    assert task.claimed_at is not None
    retried_after = task.claimed_at - _parse(first["at"])
    assert retried_after.total_seconds() >= 1.5, retried_after


def _parse(stamp: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(stamp)


def explode(n: int) -> None:
    raise ValueError(f"boom-{n}")


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_unhandled_exception_keeps_its_traceback(client: batonq.Client, dsn: str, kind: str) -> None:
    app = batonq.App()

    def handle(job: batonq.Job) -> None:
        explode(job.payload["n"])

    async def handle_async(job: batonq.AsyncJob) -> None:
        explode(job.payload["n"])

    app.add_task("err:boom", handle if kind == "sync" else handle_async)
    enq = client.enqueue("err:boom", {"n": 42}, max_attempts=2)
    assert await worker(app, dsn, burst=True).run_async() == 0
    task = client.task(enq.task_id)
    # First attempt failed with the queue's backoff, so the task waits to retry.
    assert (task.state, task.attempts) == ("pending", 1)
    [attempt] = task.errors
    error = attempt["error"]
    assert error.startswith("ValueError: boom-42\n\nTraceback (most recent call last)")
    assert "in explode" in error and error.endswith("ValueError: boom-42")
    assert task.last_error == error
    assert client.claim("err:boom") == []  # the queue's backoff: not claimable at once


async def test_a_handler_cancelled_from_within_fails_and_the_worker_goes_on(
    client: batonq.Client, dsn: str
) -> None:
    """A CancelledError the handler raises itself (its own timeout, a task
    it awaited) is a failure of that job, not the worker's cancellation."""
    app = batonq.App()

    @app.task("err:cancel")
    async def cancelled(job: batonq.AsyncJob) -> str:
        if job.payload["n"] == 1:
            raise asyncio.CancelledError("gave up")
        return "ok"

    first = client.enqueue("err:cancel", {"n": 1}, max_attempts=1)
    second = client.enqueue("err:cancel", {"n": 2})
    assert await worker(app, dsn, burst=True).run_async() == 0
    failed = client.task(first.task_id)
    assert failed.state == "dead"
    assert failed.last_error is not None and "CancelledError" in failed.last_error
    assert client.task(second.task_id).result == "ok"


async def test_huge_traceback_is_cut_to_fit(client: batonq.Client, dsn: str) -> None:
    app = batonq.App()

    @app.task("err:huge")
    def huge(job: batonq.Job) -> None:
        raise RuntimeError("x" * 300_000 + " the end")

    enq = client.enqueue("err:huge", {}, max_attempts=1)
    assert await worker(app, dsn, burst=True).run_async() == 0
    task = client.task(enq.task_id)
    assert task.state == "dead" and task.last_error is not None
    assert len(task.last_error.encode()) <= 131072
    assert task.last_error.startswith("RuntimeError: xxx") and task.last_error.endswith("the end")
    assert "characters cut" in task.last_error


async def test_bad_results_fail_for_good(client: batonq.Client, dsn: str) -> None:
    app = batonq.App()

    @app.task("err:result")
    def bad(job: batonq.Job) -> Any:
        return {"not json": object()} if job.payload == "object" else "y" * 200_000

    not_json = client.enqueue("err:result", "object")
    too_big = client.enqueue("err:result", "big")
    assert await worker(app, dsn, burst=True).run_async() == 0
    first, second = client.task(not_json.task_id), client.task(too_big.task_id)
    assert first.state == second.state == "dead"
    assert first.attempts == second.attempts == 1
    assert "not JSON" in (first.last_error or "")
    assert "result refused" in (second.last_error or "")


async def test_job_handle_stage_children_and_lineage(client: batonq.Client, dsn: str) -> None:
    app = batonq.App()

    @app.task("tree:sync")
    def parent_sync(job: batonq.Job) -> dict[str, Any]:
        job.set_stage("fanning out")
        child = job.enqueue_child("tree:leaf", {"from": "sync"}, idempotency_key=f"leaf-of-{job.id}")
        return {"child": child.task_id, "fencing_token": job.fencing_token}

    @app.task("tree:async")
    async def parent_async(job: batonq.AsyncJob) -> dict[str, Any]:
        await job.set_stage("fanning out")
        child = await job.enqueue_child("tree:leaf", {"from": "async"}, idempotency_key=f"leaf-of-{job.id}")
        return {"child": child.task_id, "fencing_token": job.fencing_token}

    @app.task("tree:leaf")
    def leaf(job: batonq.Job) -> dict[str, Any]:
        return {"parent": job.parent_id, "root": job.root_id}

    roots = [client.enqueue("tree:sync", {}).task_id, client.enqueue("tree:async", {}).task_id]
    assert await worker(app, dsn, burst=True).run_async() == 0
    for root in roots:
        task = client.task(root)
        assert task.state == "done" and task.stage == "fanning out"
        assert task.result["fencing_token"] == task.fencing_token
        child = client.task(task.result["child"])
        assert (child.state, child.parent_id, child.root_id) == ("done", root, root)
        assert child.result == {"parent": root, "root": root}


async def test_a_job_knows_its_group_and_hands_one_to_its_children(client: batonq.Client, dsn: str) -> None:
    app = batonq.App()

    @app.task("groups:parent")
    def parent(job: batonq.Job) -> None:
        job.enqueue_child("groups:child", {}, group=job.group)

    @app.task("groups:child")
    def child(job: batonq.Job) -> str | None:
        return job.group

    client.enqueue("groups:parent", {}, group="acme")
    assert await worker(app, dsn, burst=True).run_async() == 0
    [done] = client.tasks("groups:child")
    assert (done.group, done.result) == ("acme", "acme")


async def test_middleware_sees_every_job(client: batonq.Client, dsn: str) -> None:
    seen: list[tuple[str, ...]] = []

    class Record(batonq.Middleware):
        def before_job(self, job: batonq.BaseJob) -> None:
            job.context["t0"] = time.monotonic()
            seen.append(("before", job.queue, str(job.payload)))

        async def after_job(self, job: batonq.BaseJob, outcome: batonq.Outcome) -> None:
            assert "t0" in job.context
            seen.append(("after", job.queue, str(job.payload), outcome.status))

    class Gate(batonq.Middleware):
        def before_job(self, job: batonq.BaseJob) -> None:
            if job.payload == "blocked":
                raise batonq.PermanentError("blocked by middleware")

    app = batonq.App(middleware=[Record()])
    app.middleware(Gate())
    ran: list[str] = []

    @app.task("mw:q")
    def handle(job: batonq.Job) -> str:
        ran.append(job.payload)
        if job.payload == "fail":
            raise batonq.PermanentError("no")
        return "ok"

    for payload in ("ok", "fail", "blocked"):
        client.enqueue("mw:q", payload)
    assert await worker(app, dsn, burst=True, concurrency=1).run_async() == 0
    assert ran == ["ok", "fail"]
    assert sorted(s for s in seen if s[0] == "after") == [
        ("after", "mw:q", "blocked", "dead"),
        ("after", "mw:q", "fail", "dead"),
        ("after", "mw:q", "ok", "done"),
    ]
    assert sum(1 for s in seen if s[0] == "before") == 3


async def test_max_tasks_stops_after_that_many(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str
) -> None:
    app = batonq.App()
    app.add_task("cap:q", lambda job: job.payload)
    client.enqueue_many("cap:q", list(range(10)))
    runner = worker(app, dsn, max_tasks=3, concurrency=2)
    assert await runner.run_async() == 0
    assert runner.claimed == runner.finished == 3
    counts = list(states(sql, "cap:q").values())
    assert counts.count("done") == 3 and counts.count("pending") == 7


class CountingClient(batonq.AsyncClient):
    """A real client that counts its claims."""

    claims = 0

    async def claim(self, queue: str, **options: Any) -> list[batonq.Lease]:
        self.claims += 1
        return await super().claim(queue, **options)


async def test_idle_worker_sleeps_on_listen(client: batonq.Client, dsn: str) -> None:
    """Idle, a worker claims about once per wait_s per queue, and a NOTIFY
    wakes it for a new task at once."""
    app = batonq.App()
    app.add_task("idle:a", lambda job: "ran")
    app.add_task("idle:b", lambda job: "ran")
    counting = await CountingClient(dsn, poll_interval_s=30).open()
    runner = batonq.Worker(app, client=counting, handle_signals=False, wait_s=30)
    running = asyncio.create_task(runner.run_async())
    try:
        async def started() -> bool:
            return counting.claims >= 2

        await eventually_async(started, timeout=10, what="the first claims")
        before = counting.claims
        await asyncio.sleep(1.5)  # a window to count idle claims in, not a synchronisation
        # At most one more round (the listener's first connect wakes it once).
        assert counting.claims - before <= 2

        enqueued_at = time.monotonic()
        enq = await asyncio.to_thread(client.enqueue, "idle:b", {})

        async def done() -> bool:
            return (await asyncio.to_thread(client.task, enq.task_id)).state == "done"

        await eventually_async(done, timeout=10, what="the task runs")
        assert time.monotonic() - enqueued_at < 5  # far below wait_s=30: a NOTIFY woke it
        runner.stop()
        assert await running == 0
    finally:
        await counting.close()


async def test_logs_a_summary_at_info_and_each_task_at_debug(
    client: batonq.Client, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = batonq.App()
    gate = asyncio.Event()

    @app.task("log:tasks")
    async def handle(job: batonq.AsyncJob) -> int:
        if job.payload["i"] == 0:
            raise batonq.PermanentError("no zero")
        if job.payload["i"] == 9:
            await gate.wait()  # the last one finishes after the others' summaries
        return int(job.payload["i"])

    def summaries() -> list[tuple[int, int, int]]:
        found = (SUMMARY.fullmatch(r.getMessage()) for r in caplog.records)
        return [(int(m["done"]), int(m["failed"]), int(m["running"])) for m in found if m]

    async def nine_summed() -> bool:
        return sum(done for done, _, _ in summaries()) == 9

    client.enqueue_many("log:tasks", [{"i": i} for i in range(10)])
    caplog.set_level("INFO", logger="batonq")
    run = asyncio.create_task(worker(app, dsn, burst=True, summary_s=0.2).run_async())
    await eventually_async(nine_summed, timeout=15, what="summaries of the first 9 tasks")
    assert sum(failed for _, failed, _ in summaries()) == 1
    assert summaries()[-1][2] == 1  # the one waiting on the gate
    gate.set()
    assert await run == 0
    messages = [r.getMessage() for r in caplog.records if r.name == "batonq.worker"]
    assert re.search(r"stopped \(exit 0\): 10 tasks finished, 1 failed, in [\d.]+ s \(\d+/s\)$", messages[-1])
    assert not any(" done in " in m for m in messages)  # each task's record is at DEBUG
    assert sum("is dead" in m for m in messages) == 1  # failures stay at WARNING

    caplog.clear()
    caplog.set_level("DEBUG", logger="batonq")
    client.enqueue_many("log:tasks", [{"i": i} for i in range(1, 4)])
    assert await worker(app, dsn, burst=True).run_async() == 0
    done = [r for r in caplog.records if " done in " in r.getMessage()]
    assert len(done) == 3 and {r.levelname for r in done} == {"DEBUG"}
    assert {"task_id", "outcome", "duration_s"} <= set(done[0].__dict__)


SUMMARY = re.compile(
    r"(?P<done>\d+) tasks finished in \d+ s \(\d+/s\), (?P<failed>\d+) failed; (?P<running>\d+) running"
)
