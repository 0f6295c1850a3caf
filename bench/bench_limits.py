#!/usr/bin/env python3
"""Flow control's cost: claim + complete throughput with each limit on, against the same queue unlimited.

On a scratch database it creates (``batonq_bench_<pid>``, batonq.benchmark's
``scratch_database``; dropped afterwards unless ``--keep``), five queues, one
per setting, each limit set high enough never to bind, so what is measured
is what checking it costs a claim:

- ``unlimited``: no limit;
- ``max_leased``: ``max_leased`` 1,000,000;
- ``group_max_leased``: ``group_max_leased`` 1,000,000;
- ``rate_limit``: ``rate_limit`` 1,000,000,000 per second;
- ``group_rate_limit``: ``group_rate_limit`` 1,000,000,000 per second.

Every queue gets the same tasks: ``--tasks`` N, each with a ``group`` out of
``--groups`` (round robin), so the rows are alike and only the setting
differs. A round runs every setting once, in an order that rotates round by
round (the machine may be noisy); per setting and round: the tables are
emptied, the N tasks enqueued (untimed), ``VACUUM ANALYZE``, then
``--connections`` threads on one ``batonq.Client`` claim ``--batch`` tasks
at a time and complete them (``complete``, or ``complete_many`` for a batch
over 1) until the queue is empty, timed from a common start. The run fails
loudly unless all N tasks are done exactly once.

Reported per setting: tasks/s, the median over ``--rounds`` and the min-max;
and its ratio to ``unlimited``: the median of the per-round ratios (each
setting's run over the unlimited run of the same round) with their min-max,
the spread.

Usage::

    .venv/bin/python bench/bench_limits.py             # 5 rounds x 5 settings x 5,000 tasks (~1-2 min)
    .venv/bin/python bench/bench_limits.py --quick     # smoke: 1 round, 300 tasks
    .venv/bin/python bench/bench_limits.py --rounds 9 --tasks 20000 --batch 1 --connections 2

Results go to ``bench/results/limits-<timestamp>.json`` (``--out`` another
directory) and a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

import batonq
from batonq.benchmark import batonq_source, drive, git_commit, machine_info, postgres_info, scratch_database

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
HIGH = 1_000_000
SETTINGS: dict[str, dict[str, Any]] = {
    "unlimited": {},
    "max_leased": {"max_leased": HIGH},
    "group_max_leased": {"group_max_leased": HIGH},
    "rate_limit": {"rate_limit": 1000 * HIGH, "rate_period_s": 1.0},
    "group_rate_limit": {"group_rate_limit": 1000 * HIGH, "rate_period_s": 1.0},
}
RESULT = {"ok": True}
TABLES = ("batonq.tasks", "batonq.archive", "batonq.submits", "batonq.idempotency_keys")


def queue_of(setting: str) -> str:
    return f"bench:{setting}"


def reset(admin: psycopg.Connection[Any]) -> None:
    """Empty batonq's task tables: truncate just the partitions holding rows."""
    leaves: list[str] = []
    for table in TABLES:
        rows = admin.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {table}").fetchall()
        leaves += [str(leaf) for (leaf,) in rows]
    if leaves:
        admin.execute(f"TRUNCATE {', '.join(leaves)}")


def prepare(
    client: batonq.Client, admin: psycopg.Connection[Any], setting: str, args: argparse.Namespace
) -> None:
    """Empty tables, then the N tasks in the setting's queue, VACUUM ANALYZE."""
    reset(admin)
    queue = queue_of(setting)
    for start in range(0, args.tasks, 1000):
        numbers = range(start, min(args.tasks, start + 1000))
        client.enqueue_many(
            queue, [{"n": n} for n in numbers], groups=[f"g{n % args.groups}" for n in numbers]
        )
    for table in TABLES:
        admin.execute(f"VACUUM (ANALYZE) {table}")


def _worker(client: batonq.Client, queue: str, batch: int) -> Callable[[], int]:
    def work() -> int:
        done = 0
        while leases := client.claim(queue, max_tasks=batch):
            if batch == 1:
                client.complete(leases[0].lease_token, RESULT)
            else:
                replies = client.complete_many([(lease.lease_token, RESULT) for lease in leases])
                if not all(reply.outcome == "accepted" for reply in replies):
                    raise RuntimeError(f"a completion was refused: {replies}")
            done += len(leases)
        return done

    return work


def measure(
    client: batonq.Client, admin: psycopg.Connection[Any], setting: str, args: argparse.Namespace
) -> float:
    """One timed drain of the setting's queue; tasks/s. Raises unless every task is done once."""
    queue = queue_of(setting)
    seconds, claimed = drive([_worker(client, queue, args.batch) for _ in range(args.connections)])
    row = admin.execute(
        "SELECT count(*), count(DISTINCT id) FROM batonq.archive WHERE queue = %s AND state = 'done'",
        (queue,),
    ).fetchone()
    left = admin.execute("SELECT count(*) FROM batonq.tasks").fetchone()
    if claimed != args.tasks or row != (args.tasks, args.tasks) or left != (0,):
        raise RuntimeError(
            f"{setting}: WRONG RESULTS: claimed {claimed}, done (rows, tasks) {row},"
            f" unfinished {left}, expected {args.tasks} done once each"
        )
    return args.tasks / seconds


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Per setting: tasks/s and its ratio to unlimited, per round then median [min-max]."""
    summary: dict[str, Any] = {}
    for setting in SETTINGS:
        rates = [r[setting] for r in rounds]
        ratios = [r[setting] / r["unlimited"] for r in rounds]
        summary[setting] = {"tasks_per_s": _stats(rates), "ratio_to_unlimited": _stats(ratios)}
    return summary


def run_benchmark(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    report: dict[str, Any] = {
        "benchmark": "limits",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "batonq_version": batonq.__version__,
        "git_commit": git_commit(BENCH_DIR),
        "batonq_source": batonq_source(),
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "dsn")},
        "settings": SETTINGS,
        "method": (
            "Per round, each setting once in an order rotating round by round: tables truncated, N tasks"
            f" with groups enqueued (untimed), VACUUM ANALYZE, then {args.connections} threads on one"
            f" batonq.Client claim {args.batch} at a time and complete them until the queue is empty,"
            " timed from a common start. Limits set high enough never to bind. ratio = a setting's"
            " tasks/s over unlimited's in the same round; median and min-max over the rounds."
        ),
    }
    rounds: list[dict[str, float]] = []
    order = list(SETTINGS)
    started = time.perf_counter()
    with scratch_database(args.dsn, keep=args.keep) as dsn, psycopg.connect(dsn, autocommit=True) as admin:
        report["database"] = conninfo_to_dict(dsn).get("dbname")
        report["postgres"] = postgres_info(admin)
        size = args.connections
        with batonq.connect(dsn, listen=False, min_connections=size, max_connections=size) as client:
            for setting, limits in SETTINGS.items():
                client.configure_queue(queue_of(setting), **limits)
            if args.warmup:
                prepare(client, admin, "unlimited", args)
                measure(client, admin, "unlimited", args)
            for number in range(args.rounds):
                shift = number % len(order)
                results: dict[str, float] = {}
                for setting in order[shift:] + order[:shift]:
                    prepare(client, admin, setting, args)
                    results[setting] = measure(client, admin, setting, args)
                rounds.append(results)
                log(
                    f"round {number + 1}/{args.rounds}: "
                    + ", ".join(f"{s} {results[s]:,.0f}" for s in SETTINGS)
                    + " tasks/s, results OK"
                )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    report["machine"]["loadavg_end"] = list(load) if load else None
    report["elapsed_s"] = time.perf_counter() - started
    report["rounds"] = rounds
    report["summary"] = summarise(rounds)
    report["ratios"] = {
        f"{setting} / unlimited": report["summary"][setting]["ratio_to_unlimited"]["median"]
        for setting in SETTINGS
        if setting != "unlimited"
    }
    return report


def format_table(report: dict[str, Any]) -> str:
    """A Markdown table: tasks/s and the ratio to unlimited, median [min-max]."""
    summary, args = report["summary"], report["args"]
    lines = [
        "| setting | tasks/s, median [min-max] | ratio to unlimited, median [min-max] |",
        "| --- | ---: | ---: |",
    ]
    for setting in SETTINGS:
        rate, ratio = summary[setting]["tasks_per_s"], summary[setting]["ratio_to_unlimited"]
        lines.append(
            f"| {setting} | {rate['median']:,.0f} [{rate['min']:,.0f}-{rate['max']:,.0f}]"
            f" | {ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}] |"
        )
    lines += [
        "",
        f"{report['mode']}, {len(report['rounds'])} round(s) of {args['tasks']:,} tasks per setting,"
        f" {args['groups']} groups, {args['connections']} connections, claim batch {args['batch']};"
        f" {report['elapsed_s']:.0f} s in all.",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_limits.py",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dsn", default=DEFAULT_DSN,
        help="a server, by one of its databases, as a role that may create databases (default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smoke: 1 round, 300 tasks, no warm-up")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every setting (default %(default)s)")
    parser.add_argument("--tasks", type=int, default=5_000, help="tasks per run (default %(default)s)")
    parser.add_argument("--groups", type=int, default=100, help="groups of the tasks (default %(default)s)")
    parser.add_argument("--batch", type=int, default=10, help="tasks per claim (default %(default)s)")
    parser.add_argument("--connections", type=int, default=4, help="threads, one connection each (default 4)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the untimed first run")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON results")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.tasks, args.warmup = 1, 300, False
    if min(args.rounds, args.tasks, args.groups, args.batch, args.connections) < 1:
        parser.error("--rounds, --tasks, --groups, --batch and --connections must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run_benchmark(args, log=lambda line: print(line, file=sys.stderr, flush=True))
    report["command"] = " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"limits-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
