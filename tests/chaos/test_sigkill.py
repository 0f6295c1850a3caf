"""Crashed work comes back: a worker process killed with SIGKILL mid-task
loses its task when its lease runs out, to a claim or to the sweeper alone;
after max_attempts (3) deaths the task is dead."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from typing import Any

import pytest
from tests.proc_worker import Worker
from tests.waiting import wait_for

import batonq

pytestmark = pytest.mark.chaos

Q = "chaos"
LEASE_S = 2
RECOVERY_S = LEASE_S + 2  # a dead holder's task is back within this, counted from its death


def start_holder(dsn: str, name: str, stack: contextlib.ExitStack) -> Worker:
    """A worker process that long-polls one claim under a LEASE_S lease and
    then sits on the task; returns once it is connected and polling."""
    worker = stack.enter_context(Worker("hold", dsn, Q, str(LEASE_S), "20", name))
    assert worker.read_line(timeout=30) == "ready"
    return worker


def read_lease(worker: Worker, timeout: float) -> dict[str, Any]:
    lease = json.loads(worker.read_line(timeout=timeout))
    assert lease is not None, "the worker's claim came back empty"
    return dict(lease)


def kill(worker: Worker) -> float:
    """SIGKILL the worker mid-task; returns when it died."""
    assert worker.sigkill() == -signal.SIGKILL
    died = time.monotonic()
    worker.close()
    return died


def test_claims_take_back_a_killed_workers_task_until_it_is_dead(client: batonq.Client, dsn: str) -> None:
    task_id = client.enqueue(Q, {"job": "crashy"}).task_id
    with contextlib.ExitStack() as stack:
        holder = start_holder(dsn, "w1", stack)
        lease = read_lease(holder, timeout=10)
        assert (lease["task_id"], lease["attempt"]) == (task_id, 1)
        tokens = [lease["fencing_token"]]
        for death in (1, 2):
            held = client.task(task_id)
            assert (held.state, held.fencing_token, held.worker) == ("leased", tokens[-1], f"w{death}")
            assert held.lease_expires_at is not None
            # The next worker is already polling when this one dies.
            successor = start_holder(dsn, f"w{death + 1}", stack)
            died = kill(holder)
            holder = successor
            lease = read_lease(holder, timeout=RECOVERY_S + 5)
            recovered_in = time.monotonic() - died
            assert recovered_in < RECOVERY_S, (
                f"death {death}: claimable again only after {recovered_in:.2f} s"
            )
            assert (lease["task_id"], lease["attempt"]) == (task_id, death + 1)
            assert lease["fencing_token"] > tokens[-1]
            tokens.append(lease["fencing_token"])
            # One holder: the new claim came only once the dead one's lease ran out.
            now = client.task(task_id)
            assert now.claimed_at is not None and now.claimed_at >= held.lease_expires_at
            assert (now.worker, now.last_error) == (f"w{death + 1}", "lease expired")

        died = kill(holder)  # the third death: no attempts left

        def claim_finds_it_dead() -> batonq.Task | None:
            assert client.claim(Q) == [], "a task out of attempts was handed out again"
            task = client.task(task_id)
            return task if task.state == "dead" else None

        dead = wait_for(claim_finds_it_dead, timeout=RECOVERY_S + 5, what="the task to die")
        assert time.monotonic() - died < RECOVERY_S
    assert dead.last_error == "lease expired after max attempts"
    assert (dead.attempts, dead.max_attempts, dead.fencing_token) == (3, 3, tokens[-1])
    assert [(e["attempt"], e["fencing_token"], e["error"]) for e in dead.errors] == [
        (1, tokens[0], "lease expired"),
        (2, tokens[1], "lease expired"),
        (3, tokens[2], "lease expired after max attempts"),
    ]
    assert client.claim(Q) == []


def test_the_sweeper_alone_takes_back_a_killed_workers_task(client: batonq.Client, dsn: str) -> None:
    task_id = client.enqueue(Q, {"job": "crashy"}).task_id

    def back() -> batonq.Task | None:
        task = client.task(task_id)
        return task if task.state != "leased" else None

    sweeper = batonq.Sweeper(dsn, interval_s=0.2)
    sweeper.start()
    try:
        wait_for(lambda: sweeper.is_leader, timeout=5, what="the sweeper to lead")
        tokens: list[int] = []
        for death in (1, 2, 3):
            # Nobody claims from the queue but this worker, which then dies.
            with contextlib.ExitStack() as stack:
                holder = start_holder(dsn, f"w{death}", stack)
                lease = read_lease(holder, timeout=10)
                assert (lease["task_id"], lease["attempt"]) == (task_id, death)
                tokens.append(lease["fencing_token"])
                assert client.task(task_id).state == "leased"
                died = kill(holder)

            task = wait_for(back, timeout=RECOVERY_S + 5, what=f"the sweeper to expire death {death}")
            took = time.monotonic() - died
            assert took < RECOVERY_S, f"death {death}: the sweeper took {took:.2f} s"
            assert task.attempts == death
            if death < 3:
                assert (task.state, task.last_error) == ("pending", "lease expired")
        assert (task.state, task.last_error) == ("dead", "lease expired after max attempts")
        assert task.fencing_token == tokens[-1]
        assert sweeper.swept == 3
    finally:
        sweeper.stop()
    assert client.claim(Q) == []
