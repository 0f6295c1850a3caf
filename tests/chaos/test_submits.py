"""Scenario 5, racing submits: every task is completed at once by eight
copies of its holder and by an older holder whose lease ran out and was
claimed again; a quarter of the leases run out during the race, while a
sweeper expires them and a claimer takes them. Exactly one write per task is
accepted, carrying the newest token; copies replay; the older holder is refused."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from tests.chaos.battery import Database, report, run_threads
from tests.waiting import wait_for

import batonq

pytestmark = pytest.mark.chaos

Q = "chaos:race"
TASKS = int(os.environ.get("CHAOS_RACE_TASKS", "400"))
COPIES = 8


def test_racing_submits(db: Database) -> None:
    answers: dict[int, list[tuple[str, str, int]]] = defaultdict(list)  # task -> (who, outcome, token)
    lock = threading.Lock()

    def note(who: str, task_id: int, outcome: str, token: int) -> None:
        with lock:
            answers[task_id].append((who, outcome, token))

    with batonq.connect(db.dsn, max_connections=4, listen=False) as client:
        client.enqueue_many(Q, [{"n": n} for n in range(TASKS)], max_attempts=5)
        older = client.claim(Q, max_tasks=TASKS, lease_s=1)
        expires = max(lease.lease_expires_at for lease in older)
        wait_for(
            lambda: db.sql("SELECT now() > %s", (expires,))[0][0],
            timeout=10,
            what="the first leases to run out",
        )
        # A quarter of the new leases last 1 s: they run out mid-race.
        boundary = client.claim(Q, max_tasks=TASKS // 4, lease_s=1)
        holders = boundary + client.claim(Q, max_tasks=TASKS, lease_s=60)
    assert sorted(h.task_id for h in holders) == sorted(o.task_id for o in older)
    racing = threading.Event()

    def submitter(who: str, leases: list[batonq.Lease]) -> None:
        with batonq.connect(db.dsn, min_connections=1, max_connections=1, listen=False) as client:
            racing.wait()
            for lease in random.sample(leases, len(leases)):
                try:
                    outcome = client.complete(
                        lease.lease_token, {"by": who, "token": lease.fencing_token}
                    ).outcome
                except batonq.LeaseLost as lost:
                    outcome = f"refused:{lost.state}"
                note(who, lease.task_id, outcome, lease.fencing_token)

    def claimer() -> None:
        """Takes the leases that ran out, and completes them."""
        with batonq.connect(db.dsn, min_connections=1, max_connections=1, listen=False) as client:
            racing.wait()
            while not done.is_set():
                for lease in client.claim(Q, max_tasks=10, lease_s=60):
                    outcome = client.complete(
                        lease.lease_token, {"by": "claimer", "token": lease.fencing_token}
                    )
                    note("claimer", lease.task_id, outcome.outcome, lease.fencing_token)

    done = threading.Event()
    sweeper = batonq.Sweeper(db.dsn, interval_s=0.1)
    sweeper.start()
    claiming = threading.Thread(target=claimer)
    claiming.start()
    try:
        started = time.monotonic()
        # The race starts 0.9 s into the 1 s leases: their expiry falls inside it.
        soon = boundary[0].lease_expires_at
        wait_for(
            lambda: db.sql("SELECT now() > %s - interval '100 ms'", (soon,))[0][0], timeout=5, every=0.01
        )
        racing.set()
        run_threads([lambda i=i: submitter(f"copy{i}", holders) for i in range(COPIES)]
                    + [lambda: submitter("older", older)])  # fmt: skip
        took = time.monotonic() - started
    finally:
        done.set()
        claiming.join(timeout=60)
        sweeper.stop()

    final = {row[0]: row[1:] for row in db.sql(
        "SELECT id, state, fencing_token, result FROM batonq.archive WHERE queue = %s", (Q,))}  # fmt: skip
    problems, counts = judge(holders, answers, final)
    assert not problems, "\n".join(problems[:20])
    report(
        "racing_submits",
        {"tasks": TASKS, "submits": sum(counts.values()), "outcomes": dict(counts), "race_s": round(took, 1)},
    )


def judge(
    holders: list[batonq.Lease], answers: dict[int, list[tuple[str, str, int]]], final: dict[int, Any]
) -> tuple[list[str], dict[str, int]]:
    """Per task: exactly one accepted write, the task done with its token; the
    older holder always refused. Returns the problems and the outcome counts."""
    problems = []
    counts: dict[str, int] = defaultdict(int)
    for lease in holders:
        mine = answers[lease.task_id]
        accepted = [(who, token) for who, outcome, token in mine if outcome == "accepted"]
        for who, outcome, _ in mine:
            counts[f"{'older' if who == 'older' else who.rstrip('0123456789')}:{outcome}"] += 1
        state, token, result = final.get(lease.task_id, ("missing", None, None))
        if len(accepted) != 1:
            problems.append(f"t_{lease.task_id}: accepted {accepted}")
        elif (state, token, result["token"]) != ("done", accepted[0][1], accepted[0][1]):
            problems.append(f"t_{lease.task_id}: ended {state} {token} {result}, accepted {accepted}")
        if any(who == "older" and not outcome.startswith("refused") for who, outcome, _ in mine):
            problems.append(f"t_{lease.task_id}: the older holder got {mine}")
    return problems, counts
