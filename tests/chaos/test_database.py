"""Faults on the database's side: PostgreSQL restarted with ``-m immediate``,
batonq's backends terminated every 500 ms (while enqueues race on their
keys), one worker's database traffic frozen past two leases."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from tests.chaos.battery import (
    Database,
    Enqueuer,
    Fleet,
    Proxy,
    Service,
    check_invariants,
    done_count,
    drain,
    report,
    ticking,
)
from tests.chaos.cluster import WORKER_ROLE, Cluster
from tests.waiting import wait_for

import batonq

pytestmark = pytest.mark.chaos

LEASE_S = 2
DOWN_S = 9
PROMPT_S = 2.0
"""Once the database is back, HTTP answers 200 again within this."""
TASKS = int(os.environ.get("CHAOS_TASKS", "600"))
RACING_KEYS = int(os.environ.get("CHAOS_RACING_KEYS", "300"))


class Probe:
    """GET /v1/queues every 100 ms, each request in its own thread so that a
    slow answer does not delay the next: (sent at, took, status)."""

    def __init__(self, service: Service) -> None:
        self.http = httpx.Client(base_url=service.url, headers=service.headers(), timeout=30,
                                 limits=httpx.Limits(max_connections=400))  # fmt: skip
        self.seen: list[tuple[float, float, int]] = []
        self.sent: list[threading.Thread] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _get(self) -> None:
        sent = time.monotonic()
        try:
            status = self.http.get("/v1/queues").status_code
        except httpx.HTTPError:
            status = 0
        self.seen.append((sent, time.monotonic() - sent, status))

    def _loop(self) -> None:
        while not self.stopped.wait(0.1):
            request = threading.Thread(target=self._get, daemon=True)
            request.start()
            self.sent.append(request)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=60)
        for request in self.sent:
            request.join(timeout=60)
        self.http.close()


def failed_after_up(seen: list[tuple[float, float, int]], up: float) -> int:
    """Probe requests sent after the database was back that failed before the first success."""
    first_ok = next(sent for sent, _, status in seen if sent >= up and status == 200)
    return sum(1 for sent, _, status in seen if up <= sent < first_ok)


def test_postgres_restart_immediate_at_30_and_70_percent(
    cluster: Cluster, db: Database, workdir: Path
) -> None:
    """Scenario 2: PostgreSQL stops with ``-m immediate`` (no flush, crash
    recovery on start) when 30% and 70% of the tasks are done, and stays down
    for 9 s (long enough for a pool's reconnect backoff to reach 8 s); workers,
    an enqueuer and the HTTP service ride it out."""
    service = Service(db)
    fleet = Fleet(db, workdir, 3, slots=4, lease_s=LEASE_S)
    enqueuer = Enqueuer(db)
    probe = Probe(service)
    outages: list[tuple[float, float, float, float]] = []  # down, starting, up, first completion after
    try:
        started = time.monotonic()
        feeding = threading.Thread(target=enqueuer.run, args=([f"k-{n}" for n in range(TASKS)], 2))
        feeding.start()
        for mark in (0.3, 0.7):
            wait_for(lambda m=mark: done_count(db) >= m * TASKS, timeout=120, what=f"{mark:.0%} done")  # type: ignore[misc]
            down = time.monotonic()
            cluster.stop("immediate")
            wait_for(lambda d=down: time.monotonic() - d >= DOWN_S, timeout=DOWN_S + 5, every=0.1)  # type: ignore[misc]
            starting = time.monotonic()
            cluster.start()
            up = time.monotonic()
            before = done_count(db)
            wait_for(lambda b=before: done_count(db) > b, timeout=30, what="a completion after the restart")  # type: ignore[misc]
            outages.append((down, starting, up, time.monotonic()))
        feeding.join()
        ended = drain(db, since=outages[-1][2], lease_s=LEASE_S)
        assert fleet.crashed() == []
    finally:
        probe.stop()
        fleet.stop()
        service.stop()
    figures = check_invariants(db, enqueuer, fleet.history())
    assert figures["done"] + figures["dead"] == TASKS
    for down, starting, up, back in outages:
        # Sent while down: a 503 within 2 s (a 200 if the database came back meanwhile).
        while_down = [
            (sent, took, status) for sent, took, status in probe.seen if down + 0.5 <= sent < starting
        ]
        assert while_down, "the probe sent nothing while the database was down"
        slow = [(round(took, 2), status) for sent, took, status in while_down
                if took > 2 or status not in ((200, 503) if sent + took > starting else (503,))]  # fmt: skip
        assert slow == [], f"while down, answers other than a 503 within 2 s: {slow[:10]}"
        assert back - up < 10, f"throughput back only {back - up:.1f} s after the restart"
        # In the order sent (the probe records answers as they come).
        after = sorted((sent, status) for sent, _, status in probe.seen if sent >= up)
        first_ok = next(sent for sent, status in after if status == 200)
        # The pool's reconnect attempts do not back off past the outage.
        assert first_ok - up < PROMPT_S, f"HTTP answered 200 again {first_ok - up:.1f} s after the restart"
        assert all(status == 503 for sent, status in after if sent < first_ok)
    report(
        "restart",
        {
            **figures,
            "outages": [
                {
                    "down_s": round(up - down, 1),
                    "completing_again_after_s": round(back - up, 2),
                    "failed_after_up": failed_after_up(probe.seen, up),
                    "answers_while_down": sorted(
                        {status for sent, _, status in probe.seen if down + 0.5 <= sent < starting}
                    ),
                    "slowest_answer_while_down_s": round(
                        max(took for sent, took, _ in probe.seen if down + 0.5 <= sent < starting), 2
                    ),
                }
                for down, starting, up, back in outages
            ],
            "probe_requests": len(probe.seen),
            "run_s": round(ended - started, 1),
            "enqueues": enqueuer.counts(),
        },
    )


def terminate_one(cluster: Cluster, db: Database) -> None:
    """pg_terminate_backend on a random backend of batonq's role in this database."""
    pids = [pid for (pid,) in db.sql(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND usename = %s", (db.name, WORKER_ROLE)
    )]  # fmt: skip
    if pids:
        db.sql("SELECT pg_terminate_backend(%s)", (random.choice(pids),))


def test_terminate_backends_every_500_ms_while_enqueues_race(
    cluster: Cluster, db: Database, workdir: Path
) -> None:
    """Scenarios 3 and 6: a random batonq backend is terminated every 500 ms
    while workers work and 16 threads each enqueue the same keys in their own
    order; calls whose outcome is unknown are retried with the same key and
    must get the original answer (one task per key)."""
    fleet = Fleet(db, workdir, 3, slots=4, lease_s=LEASE_S)
    enqueuer = Enqueuer(db)
    keys = [f"k-{n}" for n in range(RACING_KEYS)]
    try:
        started = time.monotonic()
        with ticking(0.5, lambda: terminate_one(cluster, db)) as faults:
            enqueuer.run(keys, threads=16, copies=16)
            wait_for(
                lambda: db.unfinished() <= RACING_KEYS // 2 or time.monotonic() - started > 60, timeout=120
            )
        ended = drain(db, since=faults[-1], lease_s=LEASE_S)
        assert fleet.crashed() == []
    finally:
        fleet.stop()
    figures = check_invariants(db, enqueuer, fleet.history())
    counts = enqueuer.counts()
    assert figures["tasks"] == RACING_KEYS
    assert counts["ok"] == 16 * RACING_KEYS
    assert counts.get("unknown", 0) > 0, "no enqueue was cut off: the faults missed"
    report(
        "terminate_backend+racing_enqueues",
        {**figures, "terminations": len(faults), "enqueues": counts, "run_s": round(ended - started, 1)},
    )


def test_a_frozen_workers_late_writes_are_refused_and_its_pool_recovers(
    cluster: Cluster, db: Database, workdir: Path
) -> None:
    """Scenario 4: one worker reaches the database through a proxy that holds
    its traffic for 2.5 leases while it holds leases; other workers take
    them over; its late completions are refused, then it works again."""
    proxy = Proxy(cluster.port)
    fleet = Fleet(db, workdir, 2, slots=4, lease_s=LEASE_S)
    frozen = fleet.spawn(dsn=proxy.dsn(db.dsn))
    enqueuer = Enqueuer(db)
    try:
        enqueuer.run([f"k-{n}" for n in range(TASKS)], threads=2)

        def in_flight() -> bool:
            events = (
                [line for line in frozen.history.read_text().splitlines()] if frozen.history.exists() else []
            )
            return sum('"invoked"' in e for e in events) > sum('"invoked"' not in e for e in events)

        wait_for(in_flight, timeout=30, what="the proxied worker to hold a lease")
        proxy.flowing.clear()
        froze = time.monotonic()
        wait_for(lambda: time.monotonic() - froze >= 2.5 * LEASE_S, timeout=10, every=0.1)
        proxy.flowing.set()
        thawed = time.monotonic()
        ended = drain(db, since=thawed, lease_s=LEASE_S)
        assert fleet.crashed() == [] and frozen.alive()
    finally:
        fleet.stop()
        proxy.close()
    history = fleet.history()
    figures = check_invariants(db, enqueuer, history)
    mine = [e for e in history if e["worker"] == frozen.name]
    refused = [e for e in mine if e.get("status") == "lease_lost"]
    later_ok = [e for e in mine if e["event"] == "ok" and e["t"] > thawed]
    assert refused, f"the frozen worker's late writes were not refused: {mine[-10:]}"
    assert later_ok, "the frozen worker completed nothing after its traffic flowed again"
    report(
        "frozen_worker",
        {
            **figures,
            "frozen_s": round(thawed - froze, 1),
            "late_writes_refused": len(refused),
            "completed_after_thaw": len(later_ok),
            "run_s": round(ended - froze, 1),
        },
    )


IDLE_TASKS = int(os.environ.get("CHAOS_IDLE_TASKS", "1000"))


def _claim_latencies(db: Database, queue: str, tasks: int) -> list[float]:
    """Enqueue ``tasks`` and work them one claim at a time; each claim's seconds."""
    took = []
    with batonq.connect(db.dsn, max_connections=1, listen=False) as client:
        for start in range(0, tasks, 500):
            client.enqueue_many(queue, [{"n": n} for n in range(start, min(tasks, start + 500))])
        for _ in range(tasks):
            began = time.perf_counter()
            [lease] = client.claim(queue)
            took.append(time.perf_counter() - began)
            client.complete(lease.lease_token, None)
        assert client.claim(queue) == []
    return took


def _dead_tuples(db: Database, queue: str) -> int:
    """Dead rows in the hot table partition that holds ``queue``, by the statistics."""
    db.sql("SELECT pg_stat_force_next_flush()")
    return int(db.sql(
        """SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
            WHERE relid = (SELECT tableoid FROM batonq.tasks WHERE queue = %s LIMIT 1)
               OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'batonq.tasks'::regclass)""",
        (queue,))[0][0])  # fmt: skip


@pytest.mark.parametrize("autovacuum", ["on", "off"])
def test_an_idle_transaction_held_open_through_a_run(cluster: Cluster, db: Database, autovacuum: str) -> None:
    """Scenario 11: a session sits "idle in transaction" (holding back the
    xmin horizon, so no vacuum can remove a dead row) through a run of tasks
    worked one claim at a time. The queue keeps working; the effect on dead
    rows and claim latency is measured against the same run without it,
    with autovacuum on (naptime 1 s) and off."""
    for setting, value in (("autovacuum", autovacuum), ("autovacuum_naptime", "1s")):
        db.sql(f"ALTER SYSTEM SET {setting} = '{value}'")  # the private cluster only
    db.sql("SELECT pg_reload_conf()")
    figures: dict[str, Any] = {"autovacuum": autovacuum, "tasks": IDLE_TASKS}
    try:
        for label, queue in (("without", "chaos:free"), ("with", "chaos:idle")):
            with psycopg.connect(db.owner_dsn) as idle:
                if label == "with":
                    idle.execute("SELECT txid_current()")  # a transaction with an xid, left open
                took = sorted(_claim_latencies(db, queue, IDLE_TASKS))
                figures[label] = {
                    "claim_p50_ms": round(1000 * took[len(took) // 2], 2),
                    "claim_p99_ms": round(1000 * took[int(len(took) * 0.99)], 2),
                    "dead_rows_after": _dead_tuples(db, queue),
                    "run_s": round(sum(took), 1),
                }
                idle.rollback()
    finally:
        for setting in ("autovacuum", "autovacuum_naptime"):
            db.sql(f"ALTER SYSTEM RESET {setting}")
        db.sql("SELECT pg_reload_conf()")
    report("idle_transaction", figures)
