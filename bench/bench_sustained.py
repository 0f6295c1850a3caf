#!/usr/bin/env python3
"""Sustained mixed load: enqueue, claim and complete all at once, for minutes,
with autovacuum at PostgreSQL's defaults.

A producer keeps about 4,000 tasks pending with ``enqueue_many`` of 128;
the consumers are one ``batonq.Worker(concurrency=W)`` with a no-op handler.
The baseline is a raw mixed-load loop on the same server: the same producer
inserting into a plain table, and consumers claiming with ``UPDATE ... FOR
UPDATE SKIP LOCKED`` and marking the rows done in place (the core benchmark's
baseline statements).

Everything runs on a fresh private cluster the script starts (``initdb`` in
a temporary directory, a free port, autovacuum on at the defaults) and
stops; each case gets a fresh database in it. Per case it reports:

- throughput per window (a minute in the full run) and the last window
  against the first;
- database CPU per task: the CPU time of every process of the cluster
  (backends, autovacuum, WAL writer, checkpointer) over the tasks finished;
- dead tuples per task on the hot table: updates that were not HOT plus
  deletes (the row versions only VACUUM can reclaim), per task; and the most
  dead tuples seen at once, and how often autovacuum ran.

    .venv/bin/python bench/bench_sustained.py             # W = 4, 16, 64; 5 minutes each
    .venv/bin/python bench/bench_sustained.py --quick     # a smoke run: W = 4, 5 s each
    .venv/bin/python bench/bench_sustained.py --workers 64 --seconds 120 --window 30

Results go to ``bench/results/sustained-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import batonq
from batonq.benchmark.environment import git_commit, machine_info, with_db
from batonq.benchmark.targets import BASE_CLAIM, BASE_DONE_MANY, BASE_INSERT_MANY, BASELINE_SCHEMA, RESULT

BENCH = Path(__file__).resolve().parent
PG_BIN = Path(os.environ.get("BATONQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
QUEUE = "bench:sustained"
PENDING = 4_000
BATCH = 128
RAW_CONNECTIONS = 4
SYSTEMS = ("batonq", "raw")


# --------------------------------------------------------------------------
# The private cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(command: list[str]) -> list[str]:
    """initdb and pg_ctl refuse to run as root: run them as postgres then."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextlib.contextmanager
def private_cluster() -> Iterator[tuple[str, int]]:
    """A fresh cluster on a free port: (admin dsn, postmaster pid)."""
    root = Path(tempfile.mkdtemp(prefix="batonq-sustained-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    port = _free_port()
    subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres",
                                 "--auth=trust", "-E", "UTF8", "--no-sync"]),
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root}"
        f" -c max_connections=200 {os.environ.get('BATONQ_SUSTAINED_PG_OPTIONS', '')}"
    )
    subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                                 str(root / "log"), "-w", "start"]),
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", pid
    finally:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
                       stdout=subprocess.DEVNULL)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def cluster_cpu_s(postmaster: int) -> float:
    """CPU seconds of the whole cluster so far: the postmaster, its live
    children, and its children that exited (autovacuum workers come and go)."""
    tick = os.sysconf("SC_CLK_TCK")

    def fields(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    own = fields(postmaster)
    total = sum(int(own[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    for child in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split():
        with contextlib.suppress(OSError):
            stat = fields(int(child))
            total += int(stat[11]) + int(stat[12])
    return total / tick


# --------------------------------------------------------------------------
# Producer and consumers, each in a process of its own


def _payloads(start: int) -> list[dict[str, Any]]:
    return [{"n": i} for i in range(start, start + BATCH)]


def produce(system: str, dsn: str, enqueued: Any, done: Any, stop: Any) -> None:
    """Keep about PENDING tasks waiting: a batch whenever fewer are left."""

    async def batonq_loop() -> None:
        async with await batonq.connect_async(dsn, listen=False, max_connections=1) as client:
            while not stop.is_set():
                if enqueued.value - done.value >= PENDING:
                    await asyncio.sleep(0.002)
                    continue
                await client.enqueue_many(QUEUE, _payloads(enqueued.value))
                enqueued.value += BATCH

    def raw_loop() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                if enqueued.value - done.value >= PENDING:
                    time.sleep(0.002)
                    continue
                conn.execute(BASE_INSERT_MANY, (QUEUE, [Jsonb(p) for p in _payloads(enqueued.value)]))
                enqueued.value += BATCH

    if system == "batonq":
        asyncio.run(batonq_loop())
    else:
        raw_loop()


def consume(system: str, dsn: str, workers: int, done: Any, stop: Any) -> None:
    """batonq: one Worker(concurrency=W) with a no-op handler. raw: a few
    connections claiming up to W/4 tasks each and marking them done."""
    logging.basicConfig(level=logging.WARNING)  # the engine is measured here, not the logs

    if system == "batonq":
        app = batonq.App()

        @app.task(QUEUE)
        async def noop(job: batonq.Job) -> None:
            with done.get_lock():
                done.value += 1

        worker = batonq.Worker(app, dsn=dsn, concurrency=workers, handle_signals=False, grace_s=5)

        async def run() -> None:
            running = asyncio.create_task(worker.run_async())
            while not stop.is_set() and not running.done():
                await asyncio.sleep(0.1)
            worker.stop()
            await running

        asyncio.run(run())
        return

    batch = max(1, workers // RAW_CONNECTIONS)

    async def loop(worker: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                rows = await (
                    await conn.execute(BASE_CLAIM, (worker, QUEUE, batch), prepare=False)
                ).fetchall()
                if not rows:
                    await asyncio.sleep(0.001)
                    continue
                ids = [row[0] for row in rows]
                await conn.execute(BASE_DONE_MANY, (ids, [Jsonb(RESULT)] * len(ids)))
                with done.get_lock():
                    done.value += len(ids)

    async def run_raw() -> None:
        await asyncio.gather(*(loop(f"raw:{i}") for i in range(RAW_CONNECTIONS)))

    asyncio.run(run_raw())


# --------------------------------------------------------------------------
# One case


HOT_TABLES = {
    "batonq": "schemaname = 'batonq' AND relname ~ '^tasks_p[0-9]+$'",
    "raw": "schemaname = 'public' AND relname = 'bench_tasks'",
}


def hot_stats(conn: psycopg.Connection[Any], system: str) -> dict[str, int]:
    row = conn.execute(
        "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0),"
        "       coalesce(sum(n_tup_del), 0), coalesce(sum(n_dead_tup), 0),"
        "       coalesce(sum(autovacuum_count), 0), coalesce(sum(vacuum_count), 0)"
        f"  FROM pg_stat_user_tables WHERE {HOT_TABLES[system]}"
    ).fetchone()
    assert row is not None
    keys = ("inserted", "updated", "hot_updated", "deleted", "dead", "autovacuums", "vacuums")
    return dict(zip(keys, (int(v) for v in row), strict=True))


def profile(conn: psycopg.Connection[Any], tasks: int) -> None:
    """Server time per task of the busiest statements (needs pg_stat_statements loaded)."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    rows = conn.execute(
        "SELECT total_exec_time, total_plan_time, calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)"
        "  FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 25"
    ).fetchall()
    for exec_ms, plan_ms, calls, query in rows:
        print(
            f"{exec_ms * 1000 / tasks:8.1f} us/task exec {plan_ms * 1000 / tasks:6.1f} plan"
            f" {calls:8} calls  {query}"
        )


@dataclass
class Case:
    system: str
    workers: int
    seconds: float
    window: float


def run_case(admin_dsn: str, postmaster: int, case: Case) -> dict[str, Any]:
    dbname = f"sustained_{case.system}_{case.workers}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname}")
        admin.execute(f"CREATE DATABASE {dbname}")
    dsn = with_db(admin_dsn, dbname)
    if case.system == "batonq":
        batonq.migrate(dsn)
    else:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(BASELINE_SCHEMA)

    ctx = mp.get_context("spawn")
    enqueued, done, stop = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Event()
    procs = [
        ctx.Process(target=produce, args=(case.system, dsn, enqueued, done, stop)),
        ctx.Process(target=consume, args=(case.system, dsn, case.workers, done, stop)),
    ]
    for proc in procs:
        proc.start()
    windows: list[float] = []
    dead_peak = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Warm-up: the first full batch through, so start-up is not timed.
        deadline = time.monotonic() + 60
        while done.value < BATCH and time.monotonic() < deadline:
            time.sleep(0.05)
        before = hot_stats(conn, case.system)
        cpu0, done0, t0 = cluster_cpu_s(postmaster), done.value, time.monotonic()
        mark_done, mark_t = done0, t0
        while (now := time.monotonic()) < t0 + case.seconds:
            time.sleep(min(1.0, t0 + case.seconds - now))
            dead_peak = max(dead_peak, hot_stats(conn, case.system)["dead"])
            if time.monotonic() - mark_t >= case.window - 0.01:
                value, at = done.value, time.monotonic()
                windows.append((value - mark_done) / (at - mark_t))
                mark_done, mark_t = value, at
        cpu1, done1, t1 = cluster_cpu_s(postmaster), done.value, time.monotonic()
        if t1 - mark_t >= case.window / 2:  # the last window, cut short by the end
            windows.append((done1 - mark_done) / (t1 - mark_t))
        stop.set()
        for proc in procs:
            proc.join(60)
            if proc.exitcode is None:
                proc.kill()
        time.sleep(1.0)  # the closed sessions' statistics reach the views
        after = hot_stats(conn, case.system)
        if os.environ.get("BATONQ_SUSTAINED_PROFILE"):
            profile(conn, tasks=done1 - done0)
    tasks = done1 - done0
    diff = {k: after[k] - before[k] for k in after}
    reclaim = diff["updated"] - diff["hot_updated"] + diff["deleted"]
    result = {
        "system": case.system,
        "workers": case.workers,
        "seconds": round(t1 - t0, 1),
        "tasks": tasks,
        "tasks_per_s": round(tasks / (t1 - t0), 1),
        "windows_per_s": [round(w, 1) for w in windows],
        "last_vs_first": round(windows[-1] / windows[0], 3) if len(windows) >= 2 and windows[0] else None,
        "db_cpu_us_per_task": round((cpu1 - cpu0) / tasks * 1e6, 1) if tasks else None,
        "dead_per_task": round(reclaim / tasks, 3) if tasks else None,
        "hot_update_share": round(diff["hot_updated"] / diff["updated"], 3) if diff["updated"] else None,
        "dead_peak": dead_peak,
        "autovacuums": diff["autovacuums"],
        "vacuums": diff["vacuums"],
        "exit_codes": [proc.exitcode for proc in procs],
    }
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
    return result


def format_row(r: dict[str, Any]) -> str:
    windows = " ".join(f"{w:,.0f}" for w in r["windows_per_s"])
    return (f"{r['system']:7} W={r['workers']:<3} {r['tasks_per_s']:>8,.0f}/s"
            f"  last/first {r['last_vs_first']}"
            f"  cpu {r['db_cpu_us_per_task']} us/task  dead/task {r['dead_per_task']}"
            f"  hot-upd {r['hot_update_share']}  dead peak {r['dead_peak']:,}"
            f"  autovacuums {r['autovacuums']}  vacuums {r['vacuums']}"
            f"  windows [{windows}]")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: W=4, 5 s per case, 2.5 s windows")
    parser.add_argument("--workers", default=None, help="the Ws, comma-separated (default 4,16,64; quick 4)")
    parser.add_argument("--seconds", type=float, default=None, help="per case (default 300; quick 20)")
    parser.add_argument("--window", type=float, default=None, help="throughput window (default 60; quick 10)")
    parser.add_argument("--only", default=",".join(SYSTEMS), help="systems (default %(default)s)")
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="results directory")
    args = parser.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 300.0)
    window = args.window or (2.5 if args.quick else 60.0)
    ws = [int(w) for w in (args.workers or ("4" if args.quick else "4,16,64")).split(",")]
    systems = [s for s in args.only.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    results: list[dict[str, Any]] = []
    with private_cluster() as (admin_dsn, postmaster):
        for workers in ws:
            for system in systems:
                result = run_case(admin_dsn, postmaster, Case(system, workers, seconds, window))
                print(format_row(result), flush=True)
                results.append(result)
        with psycopg.connect(admin_dsn) as admin:
            server = str(admin.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    ratios = {}
    for workers in sorted({r["workers"] for r in results}):
        by = {r["system"]: r for r in results if r["workers"] == workers}
        if "batonq" in by and "raw" in by:
            ratios[f"W{workers}"] = round(by["batonq"]["tasks_per_s"] / by["raw"]["tasks_per_s"], 3)
            print(f"W={workers}: batonq / raw = {ratios[f'W{workers}']}")
    report = {
        "benchmark": "sustained",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "server": f"private cluster, PostgreSQL {server}, autovacuum at its defaults",
        "pending": PENDING,
        "batch": BATCH,
        "results": results,
        "batonq_vs_raw": ratios,
        "median_cpu_us_per_task": {
            s: statistics.median(r["db_cpu_us_per_task"] for r in results if r["system"] == s)
            for s in systems
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sustained-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
