#!/usr/bin/env python3
"""Every benchmark, one after the other, then the plots: the one command
behind docs/benchmarks.md.

Runs, each on scratch databases of its own on the same server:

1. ``bench_userpath.py`` the CLI as a user runs it (enqueue --from, worker --burst),
                         batonq vs PgQueuer vs the raw claim/complete loop
2. ``bench_core.py``     enqueue and claim + complete, batonq vs a raw SQL loop
3. ``bench_workers.py``  worker throughput, batonq vs PgQueuer vs Procrastinate
4. ``bench_latency.py``  enqueue -> handler start at 100 tasks/s, vs raw LISTEN/NOTIFY
5. ``bench_backlog.py``  claim latency against 1k..1M pending and 1M finished
6. ``bench_graph.py``    a 3-step queue-graph pipeline vs the same tasks without edges
7. ``bench_limits.py``   claim + complete with each flow-control limit on vs unlimited
8. ``bench_http.py``     claim + submit over HTTP vs the Python client
9. ``bench_idle.py``     CPU of an idle ``batonq worker``
10. ``bench_sustained.py`` 5 minutes of mixed load at W = 64: batonq vs a raw loop,
                         a PgQ-style queue, PgQueuer, Procrastinate and pgmq, on a
                         private cluster of its own with autovacuum on
11. ``plot.py``          PNG plots of the newest results

Then ``compare.py`` sets each ratio of the results just written against the
newest earlier result of the same kind in the results directory, and flags
every ratio that fell by more than 10% (exit code 3 when one did).

The peers run from virtualenvs of their own (``/tmp/peer-pgqueuer``,
``/tmp/peer-procrastinate``, ``/tmp/peer-pgmq``; ``peer_venvs.py``), made
here with pinned versions when missing; ``--no-peers`` leaves them out.
A step that fails is reported and the others still run; the exit code is
1 if any failed, else 3 if a ratio fell.

Usage::

    .venv/bin/python bench/run_all.py             # everything, about 45 minutes (2 cores)
    .venv/bin/python bench/run_all.py --quick     # smoke: every script's small mode, about a minute
    .venv/bin/python bench/run_all.py --only core,workers --dsn postgresql://postgres@db:5432/postgres
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from compare import compare_runs
from peer_venvs import ensure_peers

BENCH = Path(__file__).resolve().parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
STEPS = (
    "userpath", "core", "workers", "latency", "backlog", "graph", "limits",
    "http", "idle", "sustained", "plot",
)  # fmt: skip


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def commands(step: str, *, quick: bool, peers: bool, dsn: str, out: Path, img: Path) -> list[list[str]]:
    """The command lines of one step (the backlog runs 3 times in full mode)."""
    py = [sys.executable]
    if step == "userpath":
        return [
            [
                *py,
                str(BENCH / "bench_userpath.py"),
                "--dsn",
                dsn,
                *([] if peers else ["--no-peers"]),
                *(["--quick"] if quick else []),
                "--out",
                str(out / f"userpath-{_stamp()}.json"),
            ]
        ]
    if step == "core":
        return [
            [
                *py,
                str(BENCH / "bench_core.py"),
                "--dsn",
                dsn,
                "--out",
                str(out),
                *(["--quick"] if quick else []),
            ]
        ]
    if step == "workers":
        only = [] if peers else ["--only", "batonq"]
        return [
            [
                *py,
                str(BENCH / "bench_workers.py"),
                "--dsn",
                dsn,
                *only,
                *(["--quick"] if quick else []),
                "--out",
                str(out / f"workers-{_stamp()}.json"),
            ]
        ]
    if step == "latency":
        timing = ["--seconds", "2", "--runs", "1"] if quick else ["--seconds", "10", "--runs", "3"]
        return [[*py, str(BENCH / "bench_latency.py"), "--dsn", dsn, *timing, "--out", str(out)]]
    if step == "backlog":
        size = ["--quick"] if quick else []
        return [
            [
                *py,
                str(BENCH / "bench_backlog.py"),
                "--dsn",
                dsn,
                *size,
                "--json",
                str(out / f"backlog-{_stamp()}-{run}.json"),
            ]
            for run in range(1 if quick else 3)
        ]
    if step == "graph":
        return [
            [
                *py,
                str(BENCH / "bench_graph.py"),
                "--dsn",
                dsn,
                "--out",
                str(out),
                *(["--quick"] if quick else []),
            ]
        ]
    if step == "limits":
        size = ["--quick"] if quick else []
        return [[*py, str(BENCH / "bench_limits.py"), "--dsn", dsn, "--out", str(out), *size]]
    if step == "http":
        return [
            [
                *py,
                str(BENCH / "bench_http.py"),
                "--dsn",
                dsn,
                "--out",
                str(out),
                "--markdown",
                *(["--quick"] if quick else []),
            ]
        ]
    if step == "idle":
        seconds = "3" if quick else "60"
        return [[*py, str(BENCH / "bench_idle.py"), "--dsn", dsn, "--seconds", seconds, "--out", str(out)]]
    if step == "sustained":  # its own cluster: no --dsn
        only = [] if peers else ["--only", "batonq,raw,pgq"]
        size = ["--quick"] if quick else ["--workers", "64"]  # 5 minutes per system
        return [[*py, str(BENCH / "bench_sustained.py"), "--out", str(out), *only, *size]]
    if step == "plot":
        return [[*py, str(BENCH / "plot.py"), "--results", str(out), "--out", str(img)]]
    raise ValueError(f"unknown step {step!r}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="run_all.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument(
        "--dsn", default=DEFAULT_DSN, help="a server, by one of its databases (default %(default)s)"
    )
    parser.add_argument("--quick", action="store_true", help="every script's smoke mode (about a minute)")
    parser.add_argument("--no-peers", action="store_true", help="leave PgQueuer, Procrastinate and pgmq out")
    parser.add_argument("--no-compare", action="store_true", help="do not compare with the previous results")
    parser.add_argument(
        "--only", default=",".join(STEPS), help="comma-separated steps (default: %(default)s)"
    )
    parser.add_argument(
        "--out", type=Path, default=BENCH / "results", help="results directory (default bench/results)"
    )
    parser.add_argument(
        "--img", type=Path, default=None, help="plots directory (default docs/img; quick: OUT/img)"
    )
    args = parser.parse_args(argv)
    args.steps = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(args.steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    if args.img is None:
        args.img = args.out / "img" if args.quick else BENCH.parent / "docs" / "img"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    peers = not args.no_peers and bool({"workers", "userpath", "sustained"} & set(args.steps))
    if peers and (failed_peers := ensure_peers()):
        for name, why in failed_peers.items():
            print(f"peer {name} left out: {why}", file=sys.stderr)
    failed: list[str] = []
    started = time.monotonic()
    started_at = time.time()
    for number, step in enumerate(args.steps, 1):
        for command in commands(
            step, quick=args.quick, peers=peers, dsn=args.dsn, out=args.out, img=args.img
        ):
            shown = " ".join(Path(c).name if c.startswith("/") else c for c in command[1:])
            print(f"[{number}/{len(args.steps)}] {step}: {shown}", flush=True)
            began = time.monotonic()
            code = subprocess.run(command, cwd=BENCH.parent).returncode
            print(
                f"[{number}/{len(args.steps)}] {step}: exit {code} after {time.monotonic() - began:.0f} s",
                flush=True,
            )
            if code != 0:
                failed.append(step)
    print(f"done in {time.monotonic() - started:.0f} s; results in {args.out}; plots in {args.img}")
    fell = [] if args.no_compare else compare_runs(args.out, since=started_at)
    if failed:
        print(f"failed: {', '.join(dict.fromkeys(failed))}", file=sys.stderr)
        return 1
    return 3 if fell else 0


if __name__ == "__main__":
    sys.exit(main())
