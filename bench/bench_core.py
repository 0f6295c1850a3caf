#!/usr/bin/env python3
"""Core throughput of batonq against a hand-written raw psycopg loop.

Measures, on a scratch database it creates (``batonq_bench_<pid>``) and drops
again:

- enqueue: one task per call (1 and 8 connections), ``enqueue_many`` in
  batches of 100 and 10,000;
- claim + complete through the client: batch 1 (``complete``), 10 and 100
  (``complete_many``), with 1, 2 and 4 connections.

Every scenario also runs a BASELINE in the same database: a plain table with
one row per task, updated in place (single INSERT; INSERT ... SELECT unnest;
claim = UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n)
RETURNING, then an UPDATE marking the rows done), at the same batch size and
concurrency, so each batonq figure is also a ratio to it.

Each run starts from the same state: the tables are truncated, a claim
scenario's tasks are loaded untimed, then VACUUM ANALYZE. After an untimed
warm-up, batonq and the baseline alternate run by run (the machine may be
noisy), and each scenario reports the median and the min-max of its runs in
tasks per second. Results go to ``bench/results/core-<timestamp>.json`` and a
table is printed.

Usage::

    .venv/bin/python bench/bench_core.py                  # full (a few minutes)
    .venv/bin/python bench/bench_core.py --quick          # CI smoke, < 30 s
    .venv/bin/python bench/bench_core.py --dsn postgresql://postgres@db:5432/postgres

``--dsn`` names a server by one of its databases (e.g. ``postgres``) as a role
that may create databases; the benchmark never touches that database itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

import batonq

__all__ = [
    "DEFAULT_DSN",
    "SCENARIOS",
    "Scenario",
    "main",
    "run_benchmark",
]

DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUEUE = "bench:core"
RESULT: dict[str, Any] = {"ok": True}

Op = Literal["enqueue", "claim_complete"]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One measured workload: ``tasks`` per timed run (full mode)."""

    name: str
    op: Op
    batch: int
    connections: int
    tasks: int
    quick_tasks: int

    def size(self, quick: bool, scale: float) -> int:
        if quick:
            return self.quick_tasks
        # Whole batches for every connection, at least one each.
        unit = self.batch * self.connections
        return max(unit, round(self.tasks * scale / unit) * unit)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("enqueue_b1_c1", "enqueue", 1, 1, 2_000, 200),
    Scenario("enqueue_b1_c8", "enqueue", 1, 8, 4_000, 400),
    Scenario("enqueue_b100_c1", "enqueue", 100, 1, 50_000, 500),
    Scenario("enqueue_b10000_c1", "enqueue", 10_000, 1, 100_000, 10_000),
    Scenario("claim_complete_b1_c1", "claim_complete", 1, 1, 1_500, 200),
    Scenario("claim_complete_b1_c2", "claim_complete", 1, 2, 2_000, 200),
    Scenario("claim_complete_b1_c4", "claim_complete", 1, 4, 2_500, 200),
    Scenario("claim_complete_b10_c1", "claim_complete", 10, 1, 8_000, 300),
    Scenario("claim_complete_b10_c2", "claim_complete", 10, 2, 10_000, 300),
    Scenario("claim_complete_b10_c4", "claim_complete", 10, 4, 10_000, 400),
    Scenario("claim_complete_b100_c1", "claim_complete", 100, 1, 30_000, 500),
    Scenario("claim_complete_b100_c2", "claim_complete", 100, 2, 40_000, 600),
    Scenario("claim_complete_b100_c4", "claim_complete", 100, 4, 40_000, 800),
)


def _with_db(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def _payloads(start: int, n: int) -> list[dict[str, Any]]:
    return [{"n": i, "kind": "bench"} for i in range(start, start + n)]


# --------------------------------------------------------------------------
# The two systems under test


class Target(ABC):
    """A task queue the benchmark can drive: batonq, or the raw baseline."""

    label: str
    tables: tuple[str, ...]

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    @abstractmethod
    def open(self, connections: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def enqueue(self, slot: int, payloads: list[dict[str, Any]]) -> int:
        """Enqueue ``payloads`` in one call (one task: the single-task call)."""

    @abstractmethod
    def claim_complete(self, slot: int, batch: int) -> int:
        """Claim up to ``batch`` tasks, complete them; 0 when none were left."""

    @abstractmethod
    def preload(self, admin: psycopg.Connection[Any], n: int) -> None:
        """Make ``n`` claimable tasks (untimed)."""

    @abstractmethod
    def count(self, admin: psycopg.Connection[Any], op: Op) -> int:
        """How many tasks a run of ``op`` left enqueued, or completed."""

    def reset(self, admin: psycopg.Connection[Any]) -> None:
        """Empty the tables: truncate just the partitions that hold rows
        (truncating all of batonq's partitions and indexes takes long)."""
        leaves: list[str] = []
        for table in self.tables:
            rows = admin.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {table}").fetchall()
            leaves += [str(leaf) for (leaf,) in rows]
        if leaves:
            admin.execute(f"TRUNCATE {', '.join(leaves)}")

    def vacuum(self, admin: psycopg.Connection[Any]) -> None:
        for table in self.tables:
            admin.execute(f"VACUUM (ANALYZE) {table}")


class Batonq(Target):
    """batonq through its synchronous client, one pool shared by the threads."""

    label = "batonq"
    tables = ("batonq.tasks", "batonq.archive", "batonq.submits", "batonq.idempotency_keys")

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.client: batonq.Client | None = None

    def open(self, connections: int) -> None:
        self.client = batonq.connect(
            self.dsn, min_connections=connections, max_connections=connections, listen=False
        )

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _client(self) -> batonq.Client:
        assert self.client is not None, "open() first"
        return self.client

    def enqueue(self, slot: int, payloads: list[dict[str, Any]]) -> int:
        client = self._client()
        if len(payloads) == 1:
            client.enqueue(QUEUE, payloads[0])
            return 1
        return len(client.enqueue_many(QUEUE, payloads))

    def claim_complete(self, slot: int, batch: int) -> int:
        client = self._client()
        leases = client.claim(QUEUE, max_tasks=batch)
        if not leases:
            return 0
        if batch == 1:
            for lease in leases:
                client.complete(lease.lease_token, RESULT)
        else:
            replies = client.complete_many([(lease.lease_token, RESULT) for lease in leases])
            if not all(reply.outcome == "accepted" for reply in replies):
                raise RuntimeError(f"batonq refused a completion: {replies}")
        return len(leases)

    def preload(self, admin: psycopg.Connection[Any], n: int) -> None:
        client = self._client()
        for start in range(0, n, 10_000):
            client.enqueue_many(QUEUE, _payloads(start, min(10_000, n - start)))

    def count(self, admin: psycopg.Connection[Any], op: Op) -> int:
        if op == "enqueue":
            row = admin.execute("SELECT count(*) FROM batonq.tasks WHERE state = 'pending'").fetchone()
        else:
            row = admin.execute(
                "SELECT count(*) FROM batonq.archive WHERE state = 'done'"
                " AND NOT EXISTS (SELECT FROM batonq.tasks)"
            ).fetchone()
        assert row is not None
        return int(row[0])


BASELINE_SCHEMA = """
CREATE TABLE IF NOT EXISTS public.bench_tasks (
    id               bigserial PRIMARY KEY,
    queue            text NOT NULL,
    state            text NOT NULL DEFAULT 'pending',
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    worker           text,
    result           jsonb,
    finished_at      timestamptz
);
CREATE INDEX IF NOT EXISTS bench_tasks_claim_idx
    ON public.bench_tasks (queue, priority DESC, run_at, id) WHERE state = 'pending';
"""

BASE_INSERT = "INSERT INTO public.bench_tasks (queue, payload) VALUES (%s, %s) RETURNING id"
BASE_INSERT_MANY = (
    "INSERT INTO public.bench_tasks (queue, payload) SELECT %s, p FROM unnest(%s::jsonb[]) AS p RETURNING id"
)
BASE_CLAIM = """
UPDATE public.bench_tasks
   SET state = 'leased', attempts = attempts + 1,
       lease_expires_at = now() + interval '300 seconds', worker = %s
 WHERE id IN (SELECT id FROM public.bench_tasks
               WHERE queue = %s AND state = 'pending' AND run_at <= now()
               ORDER BY priority DESC, run_at, id
               LIMIT %s
                 FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
BASE_DONE = (
    "UPDATE public.bench_tasks SET state = 'done', result = %s, finished_at = now()"
    " WHERE id = %s AND state = 'leased'"
)
BASE_DONE_MANY = """
UPDATE public.bench_tasks t
   SET state = 'done', result = u.res, finished_at = now()
  FROM unnest(%s::bigint[], %s::jsonb[]) AS u(id, res)
 WHERE t.id = u.id AND t.state = 'leased'
"""


class Baseline(Target):
    """A hand-written loop on a plain table: one connection per thread.

    Claimed rows are updated in place (no archive, no ledger, no tokens); the
    table has the same kind of partial claim index as batonq's hot table.
    """

    label = "baseline"
    tables = ("public.bench_tasks",)

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conns: list[psycopg.Connection[Any]] = []
        self.worker = f"baseline:{os.getpid()}"

    def open(self, connections: int) -> None:
        self.conns = [psycopg.connect(self.dsn, autocommit=True) for _ in range(connections)]

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns = []

    def enqueue(self, slot: int, payloads: list[dict[str, Any]]) -> int:
        conn = self.conns[slot]
        if len(payloads) == 1:
            conn.execute(BASE_INSERT, (QUEUE, Jsonb(payloads[0]))).fetchall()
            return 1
        return len(conn.execute(BASE_INSERT_MANY, (QUEUE, [Jsonb(p) for p in payloads])).fetchall())

    def claim_complete(self, slot: int, batch: int) -> int:
        conn = self.conns[slot]
        # Unprepared, so planned with its LIMIT every time: as a prepared
        # statement PostgreSQL may switch to a generic plan for it, a hash
        # semi-join over the whole table.
        rows = conn.execute(BASE_CLAIM, (self.worker, QUEUE, batch), prepare=False).fetchall()
        if not rows:
            return 0
        if batch == 1:
            done = conn.execute(BASE_DONE, (Jsonb(RESULT), rows[0][0])).rowcount
        else:
            ids = [row[0] for row in rows]
            done = conn.execute(BASE_DONE_MANY, (ids, [Jsonb(RESULT)] * len(ids))).rowcount
        if done != len(rows):
            raise RuntimeError(f"baseline marked {done} of {len(rows)} tasks done")
        return len(rows)

    def preload(self, admin: psycopg.Connection[Any], n: int) -> None:
        for start in range(0, n, 10_000):
            payloads = [Jsonb(p) for p in _payloads(start, min(10_000, n - start))]
            admin.execute(BASE_INSERT_MANY, (QUEUE, payloads))

    def count(self, admin: psycopg.Connection[Any], op: Op) -> int:
        state = "pending" if op == "enqueue" else "done"
        row = admin.execute(
            "SELECT count(*) FILTER (WHERE state = %s), count(*) FROM public.bench_tasks", (state,)
        ).fetchone()
        assert row is not None
        return int(row[0]) if row[0] == row[1] else -1


# --------------------------------------------------------------------------
# Running


def drive(work: Sequence[Callable[[], int]]) -> tuple[float, int]:
    """Run each callable in its own thread, started together; (seconds, tasks)."""
    barrier = threading.Barrier(len(work) + 1)
    counts = [0] * len(work)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            counts[i] = work[i]()
        except BaseException as error:  # re-raised in the main thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(i,), name=f"bench-{i}") for i in range(len(work))]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed, sum(counts)


def _enqueue_work(target: Target, slot: int, payloads: list[dict[str, Any]], batch: int) -> Callable[[], int]:
    chunks = [payloads[i : i + batch] for i in range(0, len(payloads), batch)]

    def work() -> int:
        return sum(target.enqueue(slot, chunk) for chunk in chunks)

    return work


def _claim_work(target: Target, slot: int, batch: int) -> Callable[[], int]:
    def work() -> int:
        total = 0
        while got := target.claim_complete(slot, batch):
            total += got
        return total

    return work


def _wal_lsn(admin: psycopg.Connection[Any]) -> str:
    row = admin.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _checkpoints(admin: psycopg.Connection[Any]) -> int:
    """Checkpoints so far, server-wide: other databases' CREATE/DROP DATABASE
    force them, and every page written after one is logged in full."""
    row = admin.execute("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").fetchone()
    assert row is not None
    return int(row[0])


def _wal_bytes(admin: psycopg.Connection[Any], start: str, end: str) -> int:
    row = admin.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)).fetchone()
    assert row is not None
    return int(row[0])


@dataclass(frozen=True, slots=True)
class Run:
    seconds: float
    tasks: int
    wal_bytes: int
    checkpoints: int

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.seconds


def run_once(target: Target, admin: psycopg.Connection[Any], scenario: Scenario, n: int) -> Run:
    """One timed run of ``scenario`` over ``n`` tasks, from a clean state."""
    target.reset(admin)
    if scenario.op == "claim_complete":
        target.preload(admin, n)
    target.vacuum(admin)
    conns = scenario.connections
    if scenario.op == "enqueue":
        shares = [n // conns + (1 if slot < n % conns else 0) for slot in range(conns)]
        work = [
            _enqueue_work(target, slot, _payloads(sum(shares[:slot]), shares[slot]), scenario.batch)
            for slot in range(conns)
        ]
    else:
        work = [_claim_work(target, slot, scenario.batch) for slot in range(conns)]
    lsn, checkpoints = _wal_lsn(admin), _checkpoints(admin)
    seconds, done = drive(work)
    wal = _wal_bytes(admin, lsn, _wal_lsn(admin))
    checkpoints = _checkpoints(admin) - checkpoints
    counted = target.count(admin, scenario.op)
    if done != n or counted != n:
        raise RuntimeError(
            f"{target.label} {scenario.name}: expected {n} tasks, drove {done}, found {counted}"
        )
    return Run(seconds, n, wal, checkpoints)


def _summary(runs: Sequence[Run]) -> dict[str, Any]:
    rates = [r.tasks_per_s for r in runs]
    return {
        "median_tasks_per_s": statistics.median(rates),
        "min_tasks_per_s": min(rates),
        "max_tasks_per_s": max(rates),
        "runs_tasks_per_s": rates,
        "runs_seconds": [r.seconds for r in runs],
        # WAL is counted server-wide: other databases' writes only add to it,
        # so the least of the runs is the closest to this workload's own.
        "wal_bytes_per_task": min(r.wal_bytes / r.tasks for r in runs),
        "checkpoints_during_runs": [r.checkpoints for r in runs],
    }


def run_scenario(
    scenario: Scenario,
    targets: Sequence[Target],
    admin: psycopg.Connection[Any],
    *,
    n: int,
    warmup: int,
    runs: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Warm up every target, then alternate their runs; returns the summary."""
    results: dict[str, list[Run]] = {t.label: [] for t in targets}
    for target in targets:
        target.open(scenario.connections)
    try:
        if warmup:
            for target in targets:
                run_once(target, admin, scenario, warmup)
        for i in range(runs):
            order = targets if i % 2 == 0 else list(reversed(targets))
            for target in order:
                run = run_once(target, admin, scenario, n)
                results[target.label].append(run)
                log(f"  {scenario.name} run {i + 1}/{runs} {target.label}: {run.tasks_per_s:,.0f} tasks/s")
    finally:
        for target in targets:
            target.close()
    summary: dict[str, Any] = {
        "name": scenario.name,
        "op": scenario.op,
        "batch": scenario.batch,
        "connections": scenario.connections,
        "tasks_per_run": n,
        "warmup_tasks": warmup,
        "runs": runs,
    }
    for label, label_runs in results.items():
        summary[label] = _summary(label_runs)
    if "batonq" in results and "baseline" in results:
        summary["ratio"] = summary["batonq"]["median_tasks_per_s"] / summary["baseline"]["median_tasks_per_s"]
        paired = [
            a.tasks_per_s / b.tasks_per_s for a, b in zip(results["batonq"], results["baseline"], strict=True)
        ]
        summary["ratio_runs"] = paired
    return summary


# --------------------------------------------------------------------------
# Environment


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _mem_total_kib() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return None


def _git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip() or None
    return None


def _pressure() -> dict[str, str]:
    """Linux PSI: how much of the time tasks waited for CPU or I/O."""
    found: dict[str, str] = {}
    for kind in ("cpu", "io"):
        with contextlib.suppress(OSError, IndexError):
            found[kind] = Path(f"/proc/pressure/{kind}").read_text().splitlines()[0]
    return found


def _batonq_source() -> dict[str, Any]:
    """Which batonq ran, and whether its files differ from the commit."""
    path = Path(batonq.__file__).resolve().parent
    info: dict[str, Any] = {"path": str(path), "commit": None, "modified_files": None}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=5, check=True
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "."],
            cwd=path, capture_output=True, text=True, timeout=5, check=True,
        )  # fmt: skip
        info["commit"] = commit.stdout.strip()
        info["modified_files"] = len(status.stdout.splitlines())
    return info


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_kib": _mem_total_kib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__,
        "loadavg_start": list(load) if load else None,
        "pressure_start": _pressure(),
    }


POSTGRES_SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_level",
    "wal_compression",
    "commit_delay",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "work_mem",
    "jit",
    "max_connections",
)


def postgres_info(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    info: dict[str, Any] = {}
    row = conn.execute("SELECT version()").fetchone()
    info["version"] = row[0] if row else None
    for name in POSTGRES_SETTINGS:
        row = conn.execute(f"SHOW {name}").fetchone()
        info[name] = row[0] if row else None
    return info


@contextlib.contextmanager
def scratch_database(server_dsn: str, *, keep: bool = False) -> Iterator[str]:
    """A new database ``batonq_bench_<pid>``, migrated; dropped afterwards."""
    name = f"batonq_bench_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = _with_db(server_dsn, name)
    try:
        batonq.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(BASELINE_SCHEMA)
        yield dsn
    finally:
        if not keep:
            with psycopg.connect(server_dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------
# Entry points


def run_benchmark(
    dsn: str = DEFAULT_DSN,
    *,
    quick: bool = False,
    runs: int | None = None,
    scale: float = 1.0,
    only: Sequence[str] | None = None,
    keep_db: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the scenarios (all, or ``only`` these names); returns the report."""
    runs = runs if runs is not None else (1 if quick else 3)
    scenarios = [s for s in SCENARIOS if not only or s.name in only]
    unknown = set(only or ()) - {s.name for s in SCENARIOS}
    if unknown:
        raise ValueError(f"unknown scenarios: {', '.join(sorted(unknown))}")
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "core",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "quick" if quick else "full",
        "runs": runs,
        "scale": scale,
        "batonq_version": batonq.__version__,
        "git_commit": _git_commit(),
        "batonq_source": _batonq_source(),
        "machine": machine_info(),
        "method": (
            "Each run: truncate, load a claim scenario's tasks untimed, VACUUM ANALYZE, then time"
            " the threads (one per connection) from a common start until all finish. batonq uses"
            " one batonq.Client (pool size = connections); the baseline one psycopg connection per"
            " thread, autocommit, its claim unprepared. Warm-up run first; batonq and baseline"
            " alternate runs."
            " ratio = batonq median / baseline median (tasks/s)."
        ),
        "scenarios": [],
    }
    with scratch_database(dsn, keep=keep_db) as db, psycopg.connect(db, autocommit=True) as admin:
        report["database"] = conninfo_to_dict(db).get("dbname")
        report["postgres"] = postgres_info(admin)
        targets: list[Target] = [Batonq(db), Baseline(db)]
        for scenario in scenarios:
            n = scenario.size(quick, scale)
            unit = scenario.batch * scenario.connections
            warmup = 0 if quick else max(unit, n // 5)
            log(f"{scenario.name}: {n:,} tasks x {runs} runs (warm-up {warmup:,})")
            report["scenarios"].append(
                run_scenario(scenario, targets, admin, n=n, warmup=warmup, runs=runs, log=log)
            )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    report["machine"]["loadavg_end"] = list(load) if load else None
    report["machine"]["pressure_end"] = _pressure()
    report["elapsed_s"] = time.perf_counter() - started
    return report


def _fmt_rate(summary: dict[str, Any]) -> str:
    return (
        f"{summary['median_tasks_per_s']:>9,.0f}"
        f" ({summary['min_tasks_per_s']:,.0f}-{summary['max_tasks_per_s']:,.0f})"
    )


def format_table(report: dict[str, Any]) -> str:
    """The report as a plain-text table: medians, min-max, ratio."""
    head = (
        f"{'scenario':<24} {'batonq tasks/s (min-max)':>28} {'baseline tasks/s (min-max)':>30}"
        f" {'ratio':>6} {'WAL B/task':>12} {'ckpts':>7}"
    )
    lines = [head, "-" * len(head)]
    for s in report["scenarios"]:
        wal = f"{s['batonq']['wal_bytes_per_task']:,.0f}/{s['baseline']['wal_bytes_per_task']:,.0f}"
        ckpts = (
            f"{sum(s['batonq']['checkpoints_during_runs'])}/{sum(s['baseline']['checkpoints_during_runs'])}"
        )
        lines.append(
            f"{s['name']:<24} {_fmt_rate(s['batonq']):>28} {_fmt_rate(s['baseline']):>30}"
            f" {s['ratio']:>6.2f} {wal:>12} {ckpts:>7}"
        )
    lines.append(
        f"mode {report['mode']}, {report['runs']} run(s) per scenario, {report['elapsed_s']:.0f} s;"
        " ratio = batonq / baseline; WAL bytes per task (least of the runs, server-wide) and"
        " checkpoints during the timed runs, batonq/baseline"
    )
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"core-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_core.py",
        description="batonq core throughput (enqueue; claim+complete) against a raw psycopg baseline, "
        "on a scratch database it creates and drops.",
    )
    parser.add_argument(
        "--dsn",
        default=DEFAULT_DSN,
        help="a server's maintenance database, as a role that may create databases "
        "(default: $BATONQ_BENCH_DSN or %(default)s)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny version for CI smoke: a few hundred tasks, no warm-up, 1 run",
    )
    parser.add_argument("--runs", type=int, default=None, help="timed runs per scenario (default 3; quick 1)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the tasks per run (full mode)")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated scenario names: " + ", ".join(s.name for s in SCENARIOS),
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON results")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the scratch database")
    parser.add_argument("--quiet", action="store_true", help="print only the table")
    args = parser.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.scale <= 0:
        parser.error("--scale must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else None

    def log(message: str) -> None:
        if not args.quiet:
            print(message, flush=True)

    report = run_benchmark(
        args.dsn,
        quick=args.quick,
        runs=args.runs,
        scale=args.scale,
        only=only,
        keep_db=args.keep_db,
        log=log,
    )
    report["command"] = " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    path = write_report(report, args.out)
    print(format_table(report))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
