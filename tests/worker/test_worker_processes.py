"""``batonq worker --processes N`` as real processes: the work is shared,
SIGTERM drains every process, a second signal stops them all at once, a
child that dies is started again, and children do not outlive the
supervisor."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.waiting import wait_for as eventually
from tests.worker.support import WorkerProcess, leased, states

import batonq

APP = "tests.worker.worker_apps:app"
QUEUES = ("proc:sync", "proc:async")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        process = WorkerProcess(args, tmp_path)
        started.append(process)
        return process

    yield start
    for process in started:
        kids = _children(process.proc.pid)
        process.close()
        for pid in kids:
            _kill(pid)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _kill(pid: int) -> None:
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _two_children(worker: WorkerProcess) -> list[int]:
    kids = _children(worker.proc.pid)
    return kids if len(kids) == 2 else []


def _enqueue(client: batonq.Client, sleep: float, count: int) -> list[int]:
    return [e.task_id for q in QUEUES for e in client.enqueue_many(q, [{"sleep": sleep}] * count)]


def test_two_processes_share_the_work_and_burst_exits_0(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any
) -> None:
    ids = _enqueue(client, 0.2, 20)
    worker = spawn(APP, "--dsn", dsn, "--processes", "2", "--burst", "--concurrency", "4", "--name", "grp")
    assert worker.wait(timeout=90) == 0, worker.log()
    assert states(sql) == dict.fromkeys(ids, "done")
    pids = {client.task(t).result["pid"] for t in ids}
    assert len(pids) == 2 and worker.proc.pid not in pids, pids  # the supervisor runs no handler
    assert worker.log().count("stopped (exit 0)") == 2
    names = sql.execute("SELECT DISTINCT worker FROM batonq.archive ORDER BY 1").fetchall()
    assert names == [("grp/0",), ("grp/1",)]


def test_an_unreachable_database_exits_5_at_start(spawn: Any) -> None:
    worker = spawn(APP, "--dsn", "postgresql://postgres@127.0.0.1:1/nowhere", "--processes", "2")
    assert worker.wait(timeout=30) == 5
    assert "database_unreachable" in worker.log()
    assert "worker processes" not in worker.log()  # none was started


def test_sigterm_drains_every_process(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any
) -> None:
    ids = _enqueue(client, 2.0, 4)
    worker = spawn(APP, "--dsn", dsn, "--processes", "2", "--concurrency", "4", "--grace", "30")
    kids = eventually(lambda: _two_children(worker), timeout=30, what="two worker processes")
    eventually(lambda: leased(sql, 8), timeout=30, what="all 8 tasks claimed")
    holders = sql.execute("SELECT count(DISTINCT worker) FROM batonq.tasks WHERE state = 'leased'").fetchone()
    assert holders == (2,)

    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.log()
    # Every running job finished in its process, exactly once; no process is left.
    assert states(sql) == dict.fromkeys(ids, "done")
    assert {client.task(t).attempts for t in ids} == {1}
    assert not any(_alive(pid) for pid in kids)


def test_a_second_sigterm_stops_every_process_at_once(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any
) -> None:
    ids = _enqueue(client, 120.0, 2)
    worker = spawn(APP, "--dsn", dsn, "--processes", "2", "--concurrency", "2", "--grace", "600")
    eventually(lambda: leased(sql, 4), timeout=30, what="all 4 tasks claimed")
    worker.signal(signal.SIGTERM)
    eventually(lambda: worker.log().count("again stops at once") == 2, timeout=10, what="both processes told")
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 143, worker.log()
    assert time.monotonic() - signalled < 15  # not the 600 s grace
    assert states(sql) == dict.fromkeys(ids, "pending")  # their leases were given back


def test_a_killed_process_is_started_again(
    client: batonq.Client, sql: psycopg.Connection[Any], dsn: str, spawn: Any
) -> None:
    worker = spawn(APP, "--dsn", dsn, "--processes", "2", "--wait", "0.5")
    first = eventually(lambda: _two_children(worker), timeout=30, what="two worker processes")
    os.kill(first[0], signal.SIGKILL)

    def replaced() -> list[int]:
        kids = _two_children(worker)
        return kids if kids and first[0] not in kids else []

    now = eventually(replaced, timeout=30, what="a new process in place of the killed one")
    assert first[1] in now
    assert "was killed by SIGKILL: restarting it in 1 s" in worker.log()
    ids = _enqueue(client, 0.0, 5)  # and the group still works
    eventually(lambda: states(sql) == dict.fromkeys(ids, "done"), timeout=30, what="the new tasks done")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.log()


def test_processes_stop_when_the_supervisor_dies(dsn: str, spawn: Any) -> None:
    worker = spawn(APP, "--dsn", dsn, "--processes", "2")
    kids = eventually(lambda: _two_children(worker), timeout=30, what="two worker processes")
    eventually(lambda: worker.log().count("started: queues") == 2, timeout=30, what="both running")
    worker.signal(signal.SIGKILL)
    worker.wait(timeout=10)
    eventually(lambda: not any(_alive(pid) for pid in kids), timeout=30, what="the children gone")
