#!/usr/bin/env python3
"""Core throughput of batonq against a hand-written raw psycopg loop.

The command line, for this repository, of the engine in ``batonq.benchmark``
(src/batonq/benchmark/: what is measured and how, in its docstring; the same
engine runs behind ``batonq bench``). On a scratch database it creates
(``batonq_bench_<pid>``) and drops again, every scenario -- enqueue one by one
and in batches; claim + complete at batch 1, 10 and 100 with 1, 2 and 4
connections -- runs through batonq's client and through a baseline SQL loop on
a plain table; each figure is the median and min-max of the runs in tasks per
second, with the ratio batonq / baseline. Results go to
``bench/results/core-<timestamp>.json`` and a table is printed.

Usage::

    .venv/bin/python bench/bench_core.py                  # full (a few minutes)
    .venv/bin/python bench/bench_core.py --quick          # CI smoke, < 30 s
    .venv/bin/python bench/bench_core.py --dsn postgresql://postgres@db:5432/postgres

``--dsn`` names a server by one of its databases (e.g. ``postgres``) as a role
that may create databases; the benchmark never touches that database itself.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from batonq.benchmark import SCENARIOS, Scenario, format_table, run_benchmark, write_report

__all__ = [
    "DEFAULT_DSN",
    "SCENARIOS",
    "Scenario",
    "main",
    "run_benchmark",
]

DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"


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
        git_dir=BENCH_DIR,
    )
    report["command"] = " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    path = write_report(report, args.out)
    print(format_table(report))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
