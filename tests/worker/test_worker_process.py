"""``batonq worker`` as a real process: SIGTERM, a second signal, SIGKILL,
--burst, a handler function with --queue, and the README's quickstart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.waiting import wait_for as eventually
from tests.worker.support import ROOT, WorkerProcess, leased, states

import batonq

APP = "tests.worker.worker_apps:app"
QUEUES = ("proc:sync", "proc:async")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> WorkerProcess:
        process = WorkerProcess(args, tmp_path, cwd=cwd, env=env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


def _enqueue(client: batonq.Client, sleep: float, count: int) -> dict[int, str]:
    ids = {}
    for queue in QUEUES:
        for enq in client.enqueue_many(queue, [{"sleep": sleep}] * count):
            ids[enq.task_id] = queue
    return ids


def test_sigterm_lets_running_jobs_finish_and_releases_the_rest(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any
) -> None:
    short = _enqueue(client, 1.0, 2)
    long = _enqueue(client, 120.0, 2)
    worker = spawn(APP, "--dsn", dsn, "--grace", "4", "--lease", "30", "--concurrency", "10")
    eventually(lambda: leased(sql, 8), timeout=15, what="all 8 tasks claimed")

    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    code = worker.wait(timeout=20)
    stopped_after = time.monotonic() - signalled
    log = worker.log()
    assert code == 0, log
    assert stopped_after < 4 + 5, stopped_after  # grace, then a quick release and exit

    # In-flight jobs that could finish within grace did, exactly once.
    for task_id in short:
        task = client.task(task_id)
        assert (task.state, task.attempts) == ("done", 1), log
        assert task.result["slept"] == 1.0
    # The rest were given back: claimable at once, their attempt not counted.
    reclaimed = {}
    for queue in QUEUES:
        for lease in client.claim(queue, max_tasks=10, lease_s=60):
            reclaimed[lease.task_id] = lease
    assert set(reclaimed) == set(long), log
    assert {lease.attempt for lease in reclaimed.values()} == {1}
    # Nothing lost, nothing doubled.
    assert set(states(sql)) == set(short) | set(long)
    accepted = sql.execute("SELECT id FROM batonq.archive WHERE state = 'done'").fetchall()
    assert sorted(t for (t,) in accepted) == sorted(short)
    assert "released t_" in log


@pytest.mark.parametrize(("first", "second", "code"), [
    (signal.SIGINT, signal.SIGINT, 130),
    (signal.SIGTERM, signal.SIGTERM, 143),
])  # fmt: skip
def test_second_signal_stops_at_once(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any,
    first: int, second: int, code: int,
) -> None:  # fmt: skip
    long = _enqueue(client, 120.0, 1)
    worker = spawn(APP, "--dsn", dsn, "--grace", "600", "--lease", "300")
    eventually(lambda: leased(sql, 2), timeout=15, what="both tasks claimed")
    worker.signal(first)
    eventually(lambda: "again stops at once" in worker.log(), timeout=10, what="the first signal handled")
    signalled = time.monotonic()
    worker.signal(second)
    assert worker.wait(timeout=15) == code, worker.log()
    assert time.monotonic() - signalled < 10  # not the 600 s grace
    # Their leases were given back on the way out.
    assert states(sql) == dict.fromkeys(long, "pending")
    assert sorted(lease.task_id for q in QUEUES for lease in client.claim(q)) == sorted(long)


def test_sigkill_tasks_come_back_after_the_lease_expires(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any
) -> None:
    long = _enqueue(client, 120.0, 1)
    worker = spawn(APP, "--dsn", dsn, "--lease", "2")
    eventually(lambda: leased(sql, 2), timeout=15, what="both tasks claimed")
    worker.signal(signal.SIGKILL)
    assert worker.wait(timeout=10) == -signal.SIGKILL
    row = sql.execute("SELECT max(lease_expires_at) FROM batonq.tasks").fetchone()
    assert row is not None
    expires_at = row[0]

    reclaimed: dict[int, batonq.Lease] = {}

    def claim_all() -> bool:
        for queue in QUEUES:
            for lease in client.claim(queue, lease_s=60):
                reclaimed[lease.task_id] = lease
        return len(reclaimed) == len(long)

    eventually(claim_all, timeout=15, every=0.2, what="the killed worker's tasks come back")
    assert set(reclaimed) == set(long)
    assert {lease.attempt for lease in reclaimed.values()} == {2}  # the killed run counted
    row = sql.execute("SELECT now()").fetchone()
    assert row is not None and row[0] >= expires_at  # not before the lease ran out
    for task_id in long:
        [entry] = client.task(task_id).errors
        assert entry["error"] == "lease expired"


def test_burst_exits_0_when_the_queues_are_drained(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any
) -> None:
    ids = _enqueue(client, 0.0, 25)
    worker = spawn(APP, "--dsn", dsn, "--burst", "--concurrency", "4", "--log-format", "json",
                   "--log-level", "debug")  # fmt: skip
    assert worker.wait(timeout=60) == 0, worker.log()
    assert states(sql) == dict.fromkeys(ids, "done")
    records = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    done = [r for r in records if r.get("outcome") == "done"]
    assert len(done) == 50
    assert {"task_id", "queue", "attempt", "fencing_token", "duration_s", "worker"} <= set(done[0])


def test_a_handler_function_with_queue_and_max_tasks(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any
) -> None:
    ids = list(client.enqueue_many("proc:sync", [{"sleep": 0}] * 5))
    worker = spawn("tests.worker.worker_apps:sleep_sync", "--queue", "proc:sync", "--dsn", dsn,
                   "--max-tasks", "3", "--concurrency", "1")  # fmt: skip
    assert worker.wait(timeout=60) == 0, worker.log()
    assert sorted(states(sql).values()) == ["done"] * 3 + ["pending"] * 2
    assert len(ids) == 5


def test_a_target_that_does_not_load_is_a_usage_error(dsn: str, spawn: Any) -> None:
    worker = spawn("tests.worker.worker_apps:nothing_here", "--dsn", dsn)
    assert worker.wait(timeout=30) == 2
    assert "no attribute" in worker.log()
    worker = spawn("tests.worker.worker_apps:sleep_sync", "--dsn", dsn)
    assert worker.wait(timeout=30) == 2
    assert "--queue" in worker.log()


def test_quickstart_example_runs_end_to_end(
    client: batonq.Client, dsn: str, spawn: Any
) -> None:
    examples = ROOT / "examples"
    env = {**os.environ, "BATONQ_DATABASE_URL": dsn}
    subprocess.run([sys.executable, "worker_quickstart.py"], cwd=examples, env=env, check=True, timeout=60)
    worker = spawn("worker_quickstart:app", "--burst", cwd=examples, env=env)
    assert worker.wait(timeout=60) == 0, worker.log()
    tasks = {t.payload["to"]: t for t in client.tasks("emails")}
    assert tasks["ada@example.com"].result == {"sent_to": "ada@example.com"}
    assert tasks["grace@example.com"].state == "done"
    assert tasks["nobody"].state == "dead" and tasks["nobody"].attempts == 1
    # The README's promise: the listing shows the message, `batonq task` the traceback too.
    listing = _batonq("tasks", "emails", env=env)
    dead_id = f"t_{tasks['nobody'].id} "
    [dead_row] = [line for line in listing.splitlines() if line.lstrip().startswith(dead_id)]
    assert "dead" in dead_row and "not an address: nobody" in dead_row, listing
    assert "Traceback" not in listing, listing
    shown = _batonq("task", str(tasks["nobody"].id), env=env)
    assert "not an address: nobody" in shown and "Traceback (most recent call last)" in shown, shown


def _batonq(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "batonq", *args],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )
    return done.stdout
