"""Faults on the workers' side: processes killed mid-task, a worker whose
database traffic freezes past two leases, clocks off by five minutes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from tests.chaos.battery import Database, Enqueuer, Fleet, check_invariants, drain, report, ticking

pytestmark = pytest.mark.chaos

LEASE_S = 2
TASKS = int(os.environ.get("CHAOS_TASKS", "600"))


def test_sigkill_a_random_worker_every_2_s(db: Database, workdir: Path) -> None:
    """Scenario 1: four workers of 4 slots; every 2 s one of them, holding
    leases, dies by SIGKILL and a new one starts."""
    fleet = Fleet(db, workdir, 4, slots=4, lease_s=LEASE_S)
    enqueuer = Enqueuer(db)
    try:
        started = time.monotonic()
        with ticking(2.0, fleet.kill_one) as faults:
            enqueuer.run([f"k-{n}" for n in range(TASKS)], threads=2)
            # Faults go on while the backlog is worked through, for at least
            # 10 s and five kills (a tick every 2 s may land just after 10 s).
            while db.unfinished() > TASKS // 10 or time.monotonic() - started < 10 or fleet.kills < 5:
                assert time.monotonic() - started < 240, "no progress under kills"
                time.sleep(0.2)
        last = faults[-1] if faults else started
        ended = drain(db, since=last, lease_s=LEASE_S)
        assert fleet.crashed() == []
    finally:
        fleet.stop()
    figures = check_invariants(db, enqueuer, fleet.history())
    assert figures["done"] + figures["dead"] == TASKS
    assert fleet.kills >= 5 and figures["unknown_outcomes"] > 0, "the kills never took a lease"
    report(
        "sigkill",
        {
            **figures,
            "kills": fleet.kills,
            "run_s": round(ended - started, 1),
            "drain_after_last_fault_s": round(ended - last, 1),
            "enqueues": enqueuer.counts(),
        },
    )


def test_worker_clocks_off_by_five_minutes(db: Database, workdir: Path) -> None:
    """Scenario 7: workers whose clocks run 5 minutes ahead and 5 minutes
    behind, with jobs longer than their 2 s lease: heartbeats keep every lease
    (expiry follows the database's clock), so no attempt is lost."""
    fleet = Fleet(db, workdir, 0, slots=4, lease_s=LEASE_S)
    for skew in ("300", "-300", "300", "-300"):
        fleet.live.append(fleet.spawn(env={"CHAOS_CLOCK_SKEW_S": skew, "CHAOS_WORK_S": "1.5"}))
    enqueuer = Enqueuer(db)
    tasks = TASKS // 6
    try:
        started = time.monotonic()
        enqueuer.run([f"k-{n}" for n in range(tasks)], threads=2)
        ended = drain(db, since=started + 60, lease_s=LEASE_S)
        assert fleet.crashed() == []
    finally:
        fleet.stop()
    history = fleet.history()
    figures = check_invariants(db, enqueuer, history)
    # The skew took: the workers' wall clocks were 5 minutes off; and jobs outlived their lease.
    offsets = {round((e["wall"] - time.time()) / 60) for e in history}
    assert offsets == {-5, 5}, offsets
    began = {(e["task"], e["token"]): e["t"] for e in history if e["event"] == "invoked"}
    longer = sum(e["t"] - began[(e["task"], e["token"])] > LEASE_S for e in history if e["event"] == "ok")
    assert longer > 0
    assert (figures["done"], figures["attempts"]) == (tasks, tasks), "a lease ran out under a skewed clock"
    expired = db.sql("SELECT count(*) FROM batonq.archive WHERE errors::text LIKE '%lease expired%'")[0][0]
    assert expired == 0
    report(
        "clock_skew",
        {
            **figures,
            "skews_s": [300, -300],
            "run_s": round(ended - started, 1),
            "jobs_longer_than_lease": longer,
        },
    )
