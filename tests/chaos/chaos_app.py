"""The handlers the fault battery's worker processes run (``batonq worker
tests.chaos.chaos_app:app``), and the history they keep.

- ``chaos:a`` writes an effect row (task, fencing token, worker) to
  ``public.chaos_effects`` -- the "downstream system" -- works a little, and
  returns ``{"n": ..., "token": ...}``; the graph's edge ``chaos:a -> chaos:b``
  turns that result into a baton.
- ``chaos:b`` returns at once.
- Every job is logged, one JSON line per event, to ``$CHAOS_HISTORY``:
  ``invoked`` before the handler, then ``ok`` / ``failed`` / ``unknown`` with
  the worker's outcome. A SIGKILL leaves ``invoked`` alone: outcome unknown.
- ``$CHAOS_CLOCK_SKEW_S`` moves this process's wall clock (``time.time`` and
  what derives from it) by that many seconds: expiry must follow the
  database's clock, never the worker's.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any

import psycopg

import batonq

SKEW_S = float(os.environ.get("CHAOS_CLOCK_SKEW_S", "0"))
if SKEW_S:
    _real_time, _real_time_ns = time.time, time.time_ns
    time.time = lambda: _real_time() + SKEW_S
    time.time_ns = lambda: _real_time_ns() + int(SKEW_S * 1e9)

EFFECTS_DSN = os.environ.get("CHAOS_EFFECTS_DSN", "")
WORK_S = float(os.environ.get("CHAOS_WORK_S", "0.2"))
NAME = os.environ.get("CHAOS_NAME", str(os.getpid()))
_history = open(os.environ.get("CHAOS_HISTORY", os.devnull), "a", buffering=1)  # noqa: SIM115
_local = threading.local()

app = batonq.App()


def record(event: str, job: batonq.BaseJob, **fields: Any) -> None:
    line = {"event": event, "worker": NAME, "task": job.id, "queue": job.queue, "token": job.fencing_token,
            "attempt": job.attempt, "t": time.monotonic(), "wall": time.time(), **fields}  # fmt: skip
    _history.write(json.dumps(line) + "\n")


def _effect(task_id: int, token: int) -> None:
    """The handler's write to its downstream system, fenced by nothing: the
    battery checks afterwards that the accepted token has one."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    try:
        if conn is None or conn.closed:
            conn = _local.conn = psycopg.connect(EFFECTS_DSN, autocommit=True, connect_timeout=3)
        conn.execute("INSERT INTO chaos_effects (task_id, fencing_token, worker) VALUES (%s, %s, %s)",
                     (task_id, token, NAME))  # fmt: skip
    except psycopg.OperationalError:
        _local.conn = None
        raise


class History(batonq.Middleware):
    def before_job(self, job: batonq.BaseJob) -> None:
        record("invoked", job)

    def after_job(self, job: batonq.BaseJob, outcome: batonq.Outcome) -> None:
        kind = {"done": "ok", "unsubmitted": "unknown"}.get(outcome.status, "failed")
        record(kind, job, status=outcome.status)


app.middleware(History())


@app.task("chaos:a")
def work(job: batonq.Job) -> dict[str, Any]:
    _effect(job.id, job.fencing_token)
    job.lease_lost.wait(random.uniform(0, 2 * WORK_S))
    return {"n": job.payload["n"], "token": job.fencing_token}


@app.task("chaos:b")
def baton(job: batonq.Job) -> dict[str, Any]:
    return {"from": job.parent_id}
