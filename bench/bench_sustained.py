#!/usr/bin/env python3
"""Sustained mixed load: enqueue, claim and complete all at once, for minutes,
with autovacuum at PostgreSQL's defaults.

A producer keeps about 4,000 tasks pending with ``enqueue_many`` of 128;
the consumers are one ``batonq.Worker(concurrency=W)`` with a no-op handler.
The same producer and consumers at W for each other system, through its own
API:

- ``raw``: a raw mixed-load loop, the baseline: the producer inserting into a
  plain table, 4 connections claiming W/4 with ``UPDATE ... FOR UPDATE SKIP
  LOCKED`` and marking the rows done in place (the core benchmark's baseline
  statements);
- ``pgq``: a PgQ-style queue in plain SQL: events only appended, to one of
  three tables in turn; 4 connections take the next W/4 events after a
  shared position and finish the batch on a row of their own; a ticker
  switches the table written every few seconds and empties the next one by
  TRUNCATE once every event in it was read. No per-task state: no leases,
  retries or fencing;
- ``pgqueuer`` (1.6), ``procrastinate`` (3.10), ``pgmq`` (1.1, its SQL as the
  Python package ships it): from virtualenvs of their own
  (``peer_venvs.py``, made when missing), ``peers/sustained_peer.py``.

Everything runs on a fresh private cluster the script starts (``initdb`` in
a temporary directory, a free port, autovacuum on at the defaults) and
stops; each case gets a fresh database in it. Per case it reports:

- throughput per window (a minute in the full run) and the last window
  against the first;
- database CPU per task: the CPU time of every process of the cluster
  (backends, autovacuum, WAL writer, checkpointer) over the tasks finished;
- dead tuples per task on the hot table: updates that were not HOT plus
  deletes (the row versions only VACUUM can reclaim), per task; the same
  over every table of the system; the most dead tuples seen at once, and
  how often autovacuum ran;
- a profile of the database's time (``pg_stat_statements``, preloaded in
  the private cluster): per statement, calls, mean ms, share of the
  statements' total time, rows per call; the CPU of the autovacuum workers
  and of batonq's sweeper's connection (its sweeps and VACUUMs), sampled
  once a second (lower bounds), as shares of the cluster's.

    .venv/bin/python bench/bench_sustained.py             # W = 4, 16, 64; 5 minutes each
    .venv/bin/python bench/bench_sustained.py --quick     # a smoke run: W = 4, 5 s each
    .venv/bin/python bench/bench_sustained.py --only batonq,raw,pgq   # no virtualenvs needed
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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from bench_workers import PEERS_DIR, PgQueuer, Procrastinate, _with_db
from peer_venvs import PEERS, ensure_peers
from peers.counters import Counters
from psycopg.types.json import Jsonb

import batonq
from batonq.benchmark.environment import git_commit, machine_info
from batonq.benchmark.targets import BASE_CLAIM, BASE_DONE_MANY, BASE_INSERT_MANY, BASELINE_SCHEMA, RESULT

BENCH = Path(__file__).resolve().parent
PG_BIN = Path(os.environ.get("BATONQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
QUEUE = "bench:sustained"
PENDING = 4_000
BATCH = 128
RAW_CONNECTIONS = 4
ROTATE_S = 5.0
LOCAL = ("batonq", "raw", "pgq")
SYSTEMS = (*LOCAL, *PEERS)
PROFILED = "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"


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
def private_cluster(options: str = "") -> Iterator[tuple[str, int]]:
    """A fresh cluster on a free port, with server ``options`` (``-c
    name=value ...``): (admin dsn, postmaster pid)."""
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
        f" -c max_connections=200 {options} {os.environ.get('BATONQ_SUSTAINED_PG_OPTIONS', '')}"
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


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(postmaster: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()]


def cluster_cpu_s(postmaster: int) -> float:
    """CPU seconds of the whole cluster so far: the postmaster, its live
    children, and its children that exited (autovacuum workers come and go)."""
    tick = os.sysconf("SC_CLK_TCK")
    own = _stat(postmaster)
    total = sum(int(own[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    for child in _children(postmaster):
        with contextlib.suppress(OSError):
            stat = _stat(child)
            total += int(stat[11]) + int(stat[12])
    return total / tick


def autovacuum_pids(postmaster: int) -> list[int]:
    found = []
    for child in _children(postmaster):
        with contextlib.suppress(OSError):
            if b"autovacuum worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found


@dataclass
class CpuOf:
    """CPU seconds of a changing set of processes over the measured time,
    sampled: each counted from its value at the first sample, and one that
    shows up later from 0 (``from_zero``: it started after the first
    sample) or from when it was first seen; its last sample counts."""

    from_zero: bool
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    started: bool = False

    def sample(self, pids: list[int]) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        for pid in pids:
            with contextlib.suppress(OSError):
                stat = _stat(pid)
                cpu = (int(stat[11]) + int(stat[12])) / tick
                self.first.setdefault(pid, 0.0 if self.started and self.from_zero else cpu)
                self.last[pid] = cpu
        self.started = True

    @property
    def seconds(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


def truncate_if_drained(
    conn: psycopg.Connection[Any], table: str, *before: str, live_sql: str | None = None
) -> bool:
    """Empty a table once it holds no live row (``live_sql`` answers whether
    it does; by default, whether a task in it is pending or leased): looked
    at once without a lock, then again under the lock, so no transaction
    that could still add or change a row in it is running when it is
    emptied (the statements ``before`` run first under the lock); a short
    lock_timeout, so the claims queued behind the lock wait at most that long."""
    live_sql = live_sql or f"SELECT EXISTS (SELECT FROM {table} WHERE state IN ('pending', 'leased'))"
    live = conn.execute(live_sql).fetchone()
    if live is None or live[0]:
        return False  # not yet: no lock taken, no claim held up
    try:
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '100ms'")
            conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            live = conn.execute(live_sql).fetchone()
            if live is None or live[0]:
                return False
            for statement in before:
                conn.execute(statement)
            conn.execute(f"TRUNCATE {table}")
    except psycopg.errors.LockNotAvailable:
        return False
    return True


# --------------------------------------------------------------------------
# The PgQ-style queue: events appended to one of three tables in turn,
# read in batches by position, tables emptied by TRUNCATE. (Ids commit in
# order with one producer, so a position never skips an event.)

PGQ_TABLES = 3
PGQ_SCHEMA = "\n".join([
    "CREATE TABLE pgq_event (id bigserial, gen integer NOT NULL, payload jsonb NOT NULL)"
    " PARTITION BY LIST (gen);",
    *(f"CREATE TABLE pgq_event_{g} PARTITION OF pgq_event FOR VALUES IN ({g});" for g in range(PGQ_TABLES)),
    "CREATE INDEX ON pgq_event (id);",
    "CREATE TABLE pgq_state (one boolean PRIMARY KEY DEFAULT true CHECK (one), gen integer NOT NULL);",
    "INSERT INTO pgq_state (gen) VALUES (0);",
    "CREATE TABLE pgq_position (queue text PRIMARY KEY, pos bigint NOT NULL);",
    f"INSERT INTO pgq_position VALUES ('{QUEUE}', 0);",
    "CREATE TABLE pgq_consumer (name text PRIMARY KEY, batches bigint NOT NULL, events bigint NOT NULL,"
    " finished_at timestamptz);",
    """CREATE FUNCTION pgq_next_batch(p_queue text, p_max integer) RETURNS TABLE (id bigint, payload jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_from bigint;
    v_to   bigint;
BEGIN
    SELECT pos INTO v_from FROM pgq_position WHERE queue = p_queue FOR UPDATE;
    SELECT max(e.id) INTO v_to FROM (SELECT id FROM pgq_event WHERE id > v_from ORDER BY id LIMIT p_max) e;
    IF v_to IS NOT NULL THEN
        UPDATE pgq_position SET pos = v_to WHERE queue = p_queue;
        RETURN QUERY SELECT id, payload FROM pgq_event WHERE id > v_from AND id <= v_to;
    END IF;
END $$;""",
])  # fmt: skip
PGQ_INSERT = (
    "INSERT INTO pgq_event (gen, payload) SELECT (SELECT gen FROM pgq_state), p FROM unnest(%s::jsonb[]) p"
)
PGQ_NEXT = "SELECT id, payload FROM pgq_next_batch(%s, %s)"
PGQ_FINISH = (
    "INSERT INTO pgq_consumer VALUES (%s, 1, %s, now()) ON CONFLICT (name) DO UPDATE"
    " SET batches = pgq_consumer.batches + 1, events = pgq_consumer.events + excluded.events,"
    " finished_at = excluded.finished_at"
)


def pgq_tick(dsn: str, counters: Counters) -> None:
    """The ticker: every ROTATE_S seconds, once every event of the table
    after the one written was read, TRUNCATE it and write to it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not counters.stopped:
            time.sleep(ROTATE_S)
            row = conn.execute("SELECT gen FROM pgq_state").fetchone()
            assert row is not None
            following = (int(row[0]) + 1) % PGQ_TABLES
            table = f"pgq_event_{following}"
            live = f"SELECT EXISTS (SELECT FROM {table} WHERE id > (SELECT min(pos) FROM pgq_position))"
            truncate_if_drained(conn, table, f"UPDATE pgq_state SET gen = {following}", live_sql=live)


# --------------------------------------------------------------------------
# Producer and consumers, each in a process of its own


def _payloads(start: int) -> list[dict[str, Any]]:
    return [{"n": i} for i in range(start, start + BATCH)]


def produce(system: str, dsn: str, path: str) -> None:
    """Keep about PENDING tasks waiting: a batch whenever fewer are left."""
    counters = Counters(path)

    async def batonq_loop() -> None:
        async with await batonq.connect_async(dsn, listen=False, max_connections=1) as client:
            while not counters.stopped:
                if counters.enqueued - counters.done >= PENDING:
                    await asyncio.sleep(0.002)
                    continue
                await client.enqueue_many(QUEUE, _payloads(counters.enqueued))
                counters.enqueued += BATCH

    def sql_loop(insert: str, *before: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not counters.stopped:
                if counters.enqueued - counters.done >= PENDING:
                    time.sleep(0.002)
                    continue
                payloads = [Jsonb(p) for p in _payloads(counters.enqueued)]
                conn.execute(insert, (*before, payloads))
                counters.enqueued += BATCH

    if system == "batonq":
        asyncio.run(batonq_loop())
    elif system == "raw":
        sql_loop(BASE_INSERT_MANY, QUEUE)
    else:
        ticker = threading.Thread(target=pgq_tick, args=(dsn, counters))
        ticker.start()
        sql_loop(PGQ_INSERT)
        ticker.join()


def consume(system: str, dsn: str, workers: int, path: str) -> None:
    """batonq: one Worker(concurrency=W) with a no-op handler. raw and pgq:
    4 connections claiming up to W/4 tasks each and finishing them."""
    logging.basicConfig(level=logging.WARNING)  # the engine is measured here, not the logs
    counters = Counters(path)

    if system == "batonq":
        app = batonq.App()

        @app.task(QUEUE)
        async def noop(job: batonq.Job) -> None:
            counters.done += 1

        worker = batonq.Worker(app, dsn=dsn, concurrency=workers, handle_signals=False, grace_s=5)

        async def run() -> None:
            running = asyncio.create_task(worker.run_async())
            while not counters.stopped and not running.done():
                await asyncio.sleep(0.1)
            worker.stop()
            await running

        asyncio.run(run())
        return

    batch = max(1, workers // RAW_CONNECTIONS)

    async def loop(worker: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while not counters.stopped:
                claim = (
                    (BASE_CLAIM, (worker, QUEUE, batch)) if system == "raw" else (PGQ_NEXT, (QUEUE, batch))
                )
                rows = await (await conn.execute(*claim, prepare=False)).fetchall()
                if not rows:
                    await asyncio.sleep(0.001)
                    continue
                ids = [row[0] for row in rows]
                if system == "raw":
                    await conn.execute(BASE_DONE_MANY, (ids, [Jsonb(RESULT)] * len(ids)))
                else:
                    await conn.execute(PGQ_FINISH, (worker, len(ids)))
                counters.done += len(ids)

    async def run_loops() -> None:
        await asyncio.gather(*(loop(f"{system}:{i}") for i in range(RAW_CONNECTIONS)))

    asyncio.run(run_loops())


class Processes:
    """The producer and the consumer of one case: spawned processes of this
    interpreter for batonq, raw and pgq; the peers' script in their own
    virtualenv for the others."""

    def __init__(self, system: str, dsn: str, workers: int, counters: Counters) -> None:
        self.system = system
        self.local: list[Any] = []
        self.peers: list[subprocess.Popen[bytes]] = []
        if system in LOCAL:
            ctx = mp.get_context("spawn")
            self.local = [
                ctx.Process(target=produce, args=(system, dsn, counters.path)),
                ctx.Process(target=consume, args=(system, dsn, workers, counters.path)),
            ]
            for proc in self.local:
                proc.start()
            return
        env = {**os.environ, "BENCH_DSN": dsn, "PYTHONPATH": str(PEERS_DIR)}
        python = str(PEERS[system][0] / "bin" / "python")
        script = [python, "sustained_peer.py", system]
        self.peers = [
            subprocess.Popen(
                [*script, "produce", counters.path, str(PENDING), str(BATCH)], cwd=PEERS_DIR, env=env
            ),
            subprocess.Popen([*script, "consume", counters.path, str(workers)], cwd=PEERS_DIR, env=env),
        ]

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.local) and all(p.poll() is None for p in self.peers)

    def join(self) -> list[int | None]:
        for proc in self.local:
            proc.join(60)
            if proc.exitcode is None:
                proc.kill()
        for peer in self.peers:
            try:
                peer.wait(60)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.wait()
        return [p.exitcode for p in self.local] + [p.returncode for p in self.peers]


def install(system: str, dsn: str, counters: Counters) -> None:
    """The system's schema in a fresh database."""
    if system == "batonq":
        batonq.migrate(dsn)
    elif system in ("raw", "pgq"):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(BASELINE_SCHEMA if system == "raw" else PGQ_SCHEMA)
    elif system == "pgmq":
        subprocess.run(
            [str(PEERS["pgmq"][0] / "bin" / "python"), "sustained_peer.py", "pgmq", "setup", counters.path],
            cwd=PEERS_DIR, env={**os.environ, "BENCH_DSN": dsn, "PYTHONPATH": str(PEERS_DIR)}, check=True,
        )  # fmt: skip
    else:
        peer = (PgQueuer if system == "pgqueuer" else Procrastinate)(PEERS[system][0])
        peer.bind(dsn)
        peer.install()


# --------------------------------------------------------------------------
# One case

# The hot table, and every table the system writes.
HOT_TABLES = {
    "batonq": "schemaname = 'batonq' AND relname ~ '^tasks_p[0-9]+$'",
    "raw": "schemaname = 'public' AND relname = 'bench_tasks'",
    "pgq": "schemaname = 'public' AND relname ~ '^pgq_event_'",
    "pgqueuer": "schemaname = 'public' AND relname = 'pgqueuer'",
    "procrastinate": "schemaname = 'public' AND relname = 'procrastinate_jobs'",
    "pgmq": "schemaname = 'pgmq' AND relname = 'q_bench_sustained'",
}
ALL_TABLES = {
    "batonq": "schemaname = 'batonq'",
    "raw": "schemaname = 'public'",
    "pgq": "schemaname = 'public'",
    "pgqueuer": "schemaname = 'public'",
    "procrastinate": "schemaname = 'public'",
    "pgmq": "schemaname = 'pgmq'",
}


# batonq's sweeper's connection, by what it runs (its sweeps, schedules,
# the look for partitions due a VACUUM, and the VACUUMs):
# pg_stat_statements misses some VACUUMs (10 run, 6 counted in a check here),
# so the VACUUMs' cost is read as the CPU of that backend.
SWEEPER_BACKENDS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND query ~ '^VACUUM|batonq\\.sweep\\(\\)|batonq\\.due_schedules|n_dead_tup >= '"
)


def table_stats(conn: psycopg.Connection[Any], where: str) -> dict[str, int]:
    row = conn.execute(
        "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0),"
        "       coalesce(sum(n_tup_del), 0), coalesce(sum(n_dead_tup), 0),"
        "       coalesce(sum(autovacuum_count), 0), coalesce(sum(vacuum_count), 0)"
        f"  FROM pg_stat_user_tables WHERE {where}"
    ).fetchone()
    assert row is not None
    keys = ("inserted", "updated", "hot_updated", "deleted", "dead", "autovacuums", "vacuums")
    return dict(zip(keys, (int(v) for v in row), strict=True))


# batonq's statements by what they do (top-level statements: the functions' calls).
STATEMENTS = {
    "enqueue_many": "batonq.enqueue_many(",
    "claim": "batonq.claim(",
    "complete_many": "batonq.complete_many",
    "sweep": "batonq.sweep(",
    "VACUUM (sweeper)": "VACUUM",
}


def profile(conn: psycopg.Connection[Any], system: str) -> list[dict[str, Any]]:
    """The database's time since the last reset, by statement (the
    benchmark's own probes, which read pg_stat_statements and n_tup_hot_upd,
    left out): calls, mean ms, share of the total,
    rows per call. batonq's are grouped by what they do; the others' are
    their busiest statements."""
    rows = conn.execute(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time + total_plan_time, rows"
        "  FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        "   AND query !~ 'pg_stat_statements|n_tup_hot_upd' AND calls > 0"
    ).fetchall()
    total = sum(r[2] for r in rows) or 1.0
    groups: dict[str, list[float]] = {}
    for query, calls, ms, n in rows:
        if system == "batonq":
            label = next((k for k, v in STATEMENTS.items() if v in query), "other")
        else:
            label = query[:90]
        acc = groups.setdefault(label, [0.0, 0.0, 0.0])
        acc[0] += calls
        acc[1] += ms
        acc[2] += n
    ordered = sorted(groups.items(), key=lambda kv: -kv[1][1])
    if system != "batonq":
        ordered = ordered[:6]
    return [
        {
            "statement": label,
            "calls": int(calls),
            "mean_ms": round(ms / calls, 3),
            "share": round(ms / total, 3),
            "rows_per_call": round(n / calls, 1),
        }
        for label, (calls, ms, n) in ordered
    ]


@dataclass
class Case:
    system: str
    workers: int
    seconds: float
    window: float


def run_case(admin_dsn: str, postmaster: int, case: Case, work: Path) -> dict[str, Any]:
    dbname = f"sustained_{case.system}_{case.workers}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname}")
        admin.execute(f"CREATE DATABASE {dbname}")
    dsn = _with_db(admin_dsn, dbname)  # a URL: asyncpg takes no other form
    counters = Counters(work / f"{dbname}.counters", create=True)
    install(case.system, dsn, counters)
    hot, every = HOT_TABLES[case.system], ALL_TABLES[case.system]

    procs = Processes(case.system, dsn, case.workers, counters)
    windows: list[float] = []
    dead_peak = 0
    autovacuum, sweeper = CpuOf(from_zero=True), CpuOf(from_zero=False)

    def sample_cpu() -> None:
        autovacuum.sample(autovacuum_pids(postmaster))
        if case.system == "batonq":
            sweeper.sample([int(row[0]) for row in conn.execute(SWEEPER_BACKENDS).fetchall()])

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        # Warm-up: the first full batch through, so start-up is not timed.
        deadline = time.monotonic() + 60
        while counters.done < BATCH and time.monotonic() < deadline and procs.alive():
            time.sleep(0.05)
        before, before_all = table_stats(conn, hot), table_stats(conn, every)
        conn.execute("SELECT pg_stat_statements_reset()")
        sample_cpu()  # what they used before the start is not counted
        cpu0, done0, t0 = cluster_cpu_s(postmaster), counters.done, time.monotonic()
        mark_done, mark_t = done0, t0
        while (now := time.monotonic()) < t0 + case.seconds:
            time.sleep(min(1.0, t0 + case.seconds - now))
            dead_peak = max(dead_peak, table_stats(conn, hot)["dead"])
            sample_cpu()
            if time.monotonic() - mark_t >= case.window - 0.01:
                value, at = counters.done, time.monotonic()
                windows.append((value - mark_done) / (at - mark_t))
                mark_done, mark_t = value, at
        cpu1, done1, t1 = cluster_cpu_s(postmaster), counters.done, time.monotonic()
        if t1 - mark_t >= case.window / 2:  # the last window, cut short by the end
            windows.append((done1 - mark_done) / (t1 - mark_t))
        statements = profile(conn, case.system)
        counters.stop()
        exit_codes = procs.join()
        time.sleep(1.0)  # the closed sessions' statistics reach the views
        after, after_all = table_stats(conn, hot), table_stats(conn, every)
    tasks = done1 - done0

    def dead(a: dict[str, int], b: dict[str, int]) -> float | None:
        reclaim = (
            (a["updated"] - b["updated"])
            - (a["hot_updated"] - b["hot_updated"])
            + a["deleted"]
            - b["deleted"]
        )
        return round(reclaim / tasks, 3) if tasks else None

    diff = {k: after[k] - before[k] for k in after}
    db_cpu = cpu1 - cpu0
    result = {
        "system": case.system,
        "workers": case.workers,
        "seconds": round(t1 - t0, 1),
        "tasks": tasks,
        "tasks_per_s": round(tasks / (t1 - t0), 1),
        "windows_per_s": [round(w, 1) for w in windows],
        "last_vs_first": round(windows[-1] / windows[0], 3) if len(windows) >= 2 and windows[0] else None,
        "db_cpu_us_per_task": round(db_cpu / tasks * 1e6, 1) if tasks else None,
        "dead_per_task": dead(after, before),
        "dead_per_task_all_tables": dead(after_all, before_all),
        "hot_update_share": round(diff["hot_updated"] / diff["updated"], 3) if diff["updated"] else None,
        "dead_peak": dead_peak,
        "autovacuums": diff["autovacuums"],
        "vacuums": diff["vacuums"],
        "autovacuum_cpu_share": round(autovacuum.seconds / db_cpu, 3) if db_cpu else None,
        "sweeper_cpu_share": round(sweeper.seconds / db_cpu, 3) if db_cpu and sweeper.last else None,
        "profile": statements,
        "exit_codes": exit_codes,
    }
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
    return result


def format_row(r: dict[str, Any]) -> str:
    windows = " ".join(f"{w:,.0f}" for w in r["windows_per_s"])
    return (f"{r['system']:13} W={r['workers']:<3} {r['tasks_per_s']:>8,.0f}/s"
            f"  last/first {r['last_vs_first']}"
            f"  cpu {r['db_cpu_us_per_task']} us/task  dead/task {r['dead_per_task']}"
            f" (all tables {r['dead_per_task_all_tables']})"
            f"  hot-upd {r['hot_update_share']}  dead peak {r['dead_peak']:,}"
            f"  autovacuums {r['autovacuums']} ({r['autovacuum_cpu_share']} of the CPU)"
            f"  sweeper's backend {r['sweeper_cpu_share']} of the CPU"
            f"  vacuums {r['vacuums']}"
            f"  windows [{windows}]")  # fmt: skip


def format_profile(r: dict[str, Any]) -> str:
    lines = [f"  profile {r['system']} W={r['workers']}: calls, mean ms, share of the time, rows per call"]
    lines += [
        f"    {p['statement'][:60]:60} {p['calls']:>9,} {p['mean_ms']:>8.3f}"
        f" {p['share']:>6.1%} {p['rows_per_call']:>7}"
        for p in r["profile"]
    ]
    return "\n".join(lines)


def ratios_of(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per W, batonq's rate over each other system's (higher is better for
    batonq: a fall flags batonq slowing against it)."""
    found: dict[str, dict[str, float]] = {}
    for workers in sorted({r["workers"] for r in results}):
        by = {r["system"]: r["tasks_per_s"] for r in results if r["workers"] == workers}
        if by.get("batonq"):
            found[f"W{workers} batonq"] = {
                s: round(by["batonq"] / v, 3) for s, v in by.items() if s != "batonq" and v
            }
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: W=4, 5 s per case, 2.5 s windows")
    parser.add_argument("--workers", default=None, help="the Ws, comma-separated (default 4,16,64; quick 4)")
    parser.add_argument("--seconds", type=float, default=None, help="per case (default 300; quick 5)")
    parser.add_argument(
        "--window", type=float, default=None, help="throughput window (default 60; quick 2.5)"
    )
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
    skipped = ensure_peers([s for s in systems if s in PEERS])
    for system, why in skipped.items():
        print(f"{system} left out: {why}", file=sys.stderr)
    systems = [s for s in systems if s not in skipped]
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="batonq-sustained-") as work,
        private_cluster(PROFILED) as (
            admin_dsn,
            postmaster,
        ),
    ):
        for workers in ws:
            for system in systems:
                result = run_case(admin_dsn, postmaster, Case(system, workers, seconds, window), Path(work))
                print(format_row(result), flush=True)
                print(format_profile(result), flush=True)
                results.append(result)
        with psycopg.connect(admin_dsn) as admin:
            server = str(admin.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    ratios = ratios_of(results)
    for name, others in ratios.items():
        print(f"{name} / " + ", ".join(f"{s} {v}" for s, v in others.items()))
    report = {
        "benchmark": "sustained",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "server": f"private cluster, PostgreSQL {server}, autovacuum at its defaults,"
        " pg_stat_statements loaded",
        "pending": PENDING,
        "batch": BATCH,
        "peers": {s: PEERS[s][1][0] for s in systems if s in PEERS},
        "skipped": skipped,
        "results": results,
        "ratios": ratios,
        "median_cpu_us_per_task": {
            s: statistics.median(r["db_cpu_us_per_task"] for r in results if r["system"] == s and r["tasks"])
            for s in systems
            if any(r["tasks"] for r in results if r["system"] == s)
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"sustained-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    failed = [r["system"] for r in results if not r["tasks"] or any(c != 0 for c in r["exit_codes"])]
    if failed:
        print(f"no task done or an exit code not 0: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
