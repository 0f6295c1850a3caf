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
            # Faults go on while the backlog is worked through, for at least 10 s.
            while db.unfinished() > TASKS // 10 or time.monotonic() - started < 10:
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
    report("sigkill", {**figures, "kills": fleet.kills, "run_s": round(ended - started, 1),
                       "drain_after_last_fault_s": round(ended - last, 1), "enqueues": enqueuer.counts()})
