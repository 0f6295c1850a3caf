#!/usr/bin/env python3
"""Claim latency against backlog size.

On a scratch database it creates (``batonq_backlog_<pid>``) and drops again,
measures the latency of ``client.claim(queue, max_tasks=1)`` (each followed by
``client.complete``) and of ``client.claim(queue, max_tasks=100)`` (each
followed by ``client.complete_many``) while the database holds:

- ``pending N`` for N in the sizes (default 1,000 / 100,000 / 1,000,000):
  N pending tasks in the measured queue ``bench:target`` PLUS N pending tasks
  in four other queues (N/4 each; two of them hash to the same partition of
  ``batonq.tasks`` as the measured queue, two to other partitions), so
  2N pending tasks in all;
- ``pending 1k again``: the tables truncated and the smallest size loaded
  again (a noise check against the first row);
- ``finished F`` (default F = 1,000,000): the smallest pending backlog as
  above, plus F finished (``done``) tasks retained in ``batonq.archive``
  (today's day partition, spread over the five queues, half in the measured
  queue), as accepted completes leave them (no ledger row).

The backlog is loaded untimed by direct ``INSERT ... SELECT`` as superuser
(rows shaped as ``enqueue`` and ``complete`` would leave them: small jsonb
payload, max_attempts 3, root_id = id; archived rows with a fencing token,
claimed_at, worker, result and finished_at), then ``VACUUM ANALYZE``. During
the measurement the backlog is held steady: every 100 tasks consumed are
replaced by an untimed ``enqueue_many`` of 100 into the measured queue.

After a warm-up (200 claims at batch 1, 10 at batch 100) it times each call
with ``time.perf_counter``: ``--claims`` calls at batch 1 (default 2,000) and
``--batch-calls`` at batch 100 (default 200), on one client connection, and
reports claim p50/p99 and claim+complete p50/p99 in ms, and each backlog's
p50 as a ratio to the first (smallest) backlog's.

Usage::

    .venv/bin/python bench/bench_backlog.py            # full (~10 minutes here)
    .venv/bin/python bench/bench_backlog.py --quick    # CI smoke, < 30 s
    .venv/bin/python bench/bench_backlog.py --sizes 1000 100000 3000000 --finished 3000000

``--dsn`` names a server by one of its databases as a role that may create
databases and insert into batonq's tables directly (a superuser).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import batonq

TARGET = "bench:target"
PARTITIONS = 16
N_OTHERS = 4
REPLENISH = 100


@dataclass
class Row:
    backlog: str
    pending_target: int
    pending_other: int
    archived: int
    load_s: float
    claim1_p50_ms: float
    claim1_p99_ms: float
    cycle1_p50_ms: float
    cycle1_p99_ms: float
    claim100_p50_ms: float
    claim100_p99_ms: float
    cycle100_p50_ms: float
    cycle100_p99_ms: float


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


def partition_of(conn: psycopg.Connection[Any], queue: str) -> int:
    for r in range(PARTITIONS):
        row = conn.execute(
            "SELECT satisfies_hash_partition('batonq.tasks'::regclass, %s, %s, %s::text)",
            (PARTITIONS, r, queue),
        ).fetchone()
        if row and row[0]:
            return r
    raise RuntimeError(f"no partition for {queue}")


def pick_other_queues(conn: psycopg.Connection[Any]) -> list[str]:
    """Two queues in the measured queue's partition, two in other partitions."""
    home = partition_of(conn, TARGET)
    same: list[str] = []
    other: list[str] = []
    i = 0
    while len(same) < 2 or len(other) < 2:
        name = f"bench:other-{i}"
        i += 1
        if partition_of(conn, name) == home:
            if len(same) < 2:
                same.append(name)
        elif len(other) < 2:
            other.append(name)
    return same + other


def pending_count(conn: psycopg.Connection[Any], queue: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM batonq.tasks WHERE queue = %s AND state = 'pending'", (queue,)
    ).fetchone()
    return int(row[0]) if row else 0


def insert_pending(conn: psycopg.Connection[Any], queue: str, n: int) -> None:
    chunk = 500_000
    while n > 0:
        k = min(n, chunk)
        conn.execute(
            """
            INSERT INTO batonq.tasks (id, queue, state, priority, run_at, created_at, payload,
                                      max_attempts, root_id)
            SELECT v.id, %(q)s, 'pending', 0, v.ts, v.ts,
                   jsonb_build_object('order', v.id, 'kind', 'backlog'), 3, v.id
              FROM (SELECT nextval('batonq.task_id_seq') AS id,
                           now() - interval '2 hours' + g * interval '1 microsecond' AS ts
                      FROM generate_series(1, %(k)s::bigint) g) v
            """,
            {"q": queue, "k": k},
        )
        n -= k


def top_up(conn: psycopg.Connection[Any], queue: str, want: int) -> None:
    have = pending_count(conn, queue)
    if want > have:
        insert_pending(conn, queue, want - have)


def insert_archive(conn: psycopg.Connection[Any], queues: list[str], n: int) -> None:
    """n done tasks finished in the last ~minutes (today's partition), half in
    the measured queue, with their submit records."""
    chunk = 500_000
    done = 0
    while done < n:
        k = min(n - done, chunk)
        conn.execute(
            """
            INSERT INTO batonq.archive (id, queue, state, priority, run_at, created_at, payload,
                attempts, max_attempts, root_id, fencing_token, claimed_at, worker, errors,
                result, finished_at)
            SELECT v.id,
                   CASE WHEN v.g %% 2 = 0 THEN %(target)s
                        ELSE (%(others)s::text[])[1 + (v.g / 2) %% %(nothers)s] END,
                   'done', 0, v.ts, v.ts, jsonb_build_object('order', v.id, 'kind', 'backlog'),
                   1, 3, v.id, nextval('batonq.fencing_seq'), v.ts + interval '1 ms',
                   'bench:1', '[]', '{"ok": true}', v.ts + interval '2 ms'
              FROM (SELECT g, nextval('batonq.task_id_seq') AS id,
                           greatest(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
                                    now() - interval '30 minutes')
                             + g * interval '1 microsecond' AS ts
                      FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g) v
            """,
            {"target": TARGET, "others": queues, "nothers": len(queues),
             "lo": done + 1, "hi": done + k},
        )  # fmt: skip
        done += k


def vacuum(conn: psycopg.Connection[Any]) -> None:
    conn.execute("VACUUM ANALYZE")


def measure(client: batonq.Client, batch: int, warmup: int, calls: int) -> tuple[list[float], list[float]]:
    claims: list[float] = []
    cycles: list[float] = []
    consumed = 0
    for i in range(warmup + calls):
        t0 = time.perf_counter()
        leases = client.claim(TARGET, max_tasks=batch)
        t1 = time.perf_counter()
        if len(leases) != batch:
            raise RuntimeError(f"claimed {len(leases)}, wanted {batch}: backlog ran dry")
        if batch == 1:
            client.complete(leases[0].lease_token, {"ok": True})
        else:
            client.complete_many([(lease.lease_token, {"ok": True}) for lease in leases])
        t2 = time.perf_counter()
        if i >= warmup:
            claims.append(t1 - t0)
            cycles.append(t2 - t0)
        consumed += batch
        while consumed >= REPLENISH:  # hold the backlog steady, untimed
            client.enqueue_many(TARGET, [{"kind": "refill"}] * REPLENISH)
            consumed -= REPLENISH
    return claims, cycles


def run_scenario(
    label: str,
    admin: psycopg.Connection[Any],
    client: batonq.Client,
    others: list[str],
    pending: int,
    archived: int,
    args: argparse.Namespace,
    load: Callable[[], None],
) -> Row:
    t0 = time.perf_counter()
    load()
    vacuum(admin)
    load_s = time.perf_counter() - t0
    c1, y1 = measure(client, 1, args.warmup, args.claims)
    c100, y100 = measure(client, 100, max(1, args.warmup // 20), args.batch_calls)
    row = Row(
        backlog=label, pending_target=pending, pending_other=pending, archived=archived,
        load_s=round(load_s, 1),
        claim1_p50_ms=pct(c1, 50), claim1_p99_ms=pct(c1, 99),
        cycle1_p50_ms=pct(y1, 50), cycle1_p99_ms=pct(y1, 99),
        claim100_p50_ms=pct(c100, 50), claim100_p99_ms=pct(c100, 99),
        cycle100_p50_ms=pct(y100, 50), cycle100_p99_ms=pct(y100, 99),
    )  # fmt: skip
    print(
        f"{label:>22}: load+vacuum {load_s:6.1f}s | claim1 p50 {row.claim1_p50_ms:.2f} "
        f"p99 {row.claim1_p99_ms:.2f} ms | claim100 p50 {row.claim100_p50_ms:.2f} "
        f"p99 {row.claim100_p99_ms:.2f} ms",
        flush=True,
    )
    return row


def print_table(rows: list[Row], version: str, server: dict[str, Any]) -> None:
    base = rows[0]
    print()
    print(f"PostgreSQL {version} at {server.get('host')}:"
          f"{server.get('port')}, {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} cpus")  # fmt: skip
    print("| backlog | claim 1 p50 / p99 ms | claim+complete 1 p50 / p99 ms | "
          "claim 100 p50 / p99 ms | claim+complete_many 100 p50 / p99 ms | "
          "p50 ratio to first (1 / 100) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r.backlog} | {r.claim1_p50_ms:.2f} / {r.claim1_p99_ms:.2f} | "
            f"{r.cycle1_p50_ms:.2f} / {r.cycle1_p99_ms:.2f} | "
            f"{r.claim100_p50_ms:.2f} / {r.claim100_p99_ms:.2f} | "
            f"{r.cycle100_p50_ms:.2f} / {r.cycle100_p99_ms:.2f} | "
            f"{r.claim1_p50_ms / base.claim1_p50_ms:.2f}x / "
            f"{r.claim100_p50_ms / base.claim100_p50_ms:.2f}x |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1_000, 100_000, 1_000_000],
        help="pending backlog sizes (per side: measured queue and other queues)",
    )
    parser.add_argument(
        "--finished", type=int, default=1_000_000, help="finished tasks retained in the archive (0 skips)"
    )
    parser.add_argument("--claims", type=int, default=2_000, help="timed claims at batch 1")
    parser.add_argument("--batch-calls", type=int, default=200, help="timed claims at batch 100")
    parser.add_argument("--warmup", type=int, default=200, help="untimed claims at batch 1")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--quick", action="store_true", help="smoke: sizes 1000 10000, 10000 finished, 200 claims"
    )
    args = parser.parse_args(argv)  # fmt: skip
    if args.quick:
        args.sizes, args.finished = [1_000, 10_000], 10_000
        args.claims, args.batch_calls, args.warmup = 200, 20, 40
    sizes = sorted(args.sizes)

    server = conninfo_to_dict(args.dsn)
    dbname = f"batonq_backlog_{os.getpid()}"
    dsn = make_conninfo(args.dsn, dbname=dbname)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    rows: list[Row] = []
    try:
        batonq.migrate(dsn)
        with (
            psycopg.connect(dsn, autocommit=True) as admin,
            batonq.connect(dsn, min_connections=1, max_connections=1, listen=False) as client,
        ):
            version = admin.execute("SHOW server_version").fetchone()
            admin.execute("SELECT batonq.ensure_partitions()")
            others = pick_other_queues(admin)
            for q in [TARGET, *others]:
                client.configure_queue(q)

            def load_pending(n: int) -> Callable[[], None]:
                def load() -> None:
                    top_up(admin, TARGET, n)
                    for q in others:
                        top_up(admin, q, n // N_OTHERS)

                return load

            def reset() -> None:
                admin.execute("TRUNCATE batonq.tasks, batonq.archive, batonq.submits")

            for n in sizes:
                rows.append(run_scenario(f"pending {n:,}", admin, client, others, n, 0, args,
                                         load_pending(n)))  # fmt: skip
            if len(sizes) > 1:
                reset()
                rows.append(run_scenario(f"pending {sizes[0]:,} again", admin, client, others,
                                         sizes[0], 0, args, load_pending(sizes[0])))  # fmt: skip
            if args.finished:
                reset()

                def load_finished() -> None:
                    load_pending(sizes[0])()
                    insert_archive(admin, others, args.finished)

                rows.append(run_scenario(
                    f"pending {sizes[0]:,} + {args.finished:,} done", admin, client, others,
                    sizes[0], args.finished, args, load_finished))  # fmt: skip
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')

    print_table(rows, version[0] if version else "?", server)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
