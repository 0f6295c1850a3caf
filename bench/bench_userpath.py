#!/usr/bin/env python3
"""The worker as a user runs it: batonq's CLI against PgQueuer and the raw
claim/complete loop, wall clock from start to exit.

Two cases, each with every setting, the new database first:

- **new database**: each step in a database made for it just before (batonq
  migrated, PgQueuer installed, the raw loop's table made), and no
  ``VACUUM ANALYZE`` for any system after its load: what a new user sees
  when a first bulk load is drained at once, before autovacuum has run (or
  with it off);
- **analyzed**: the tables emptied, loaded, then ``VACUUM ANALYZE`` before
  the worker starts.

Per run and case, each setting in turn (the settings alternate, so a noisy
machine hurts them alike, and each run starts one setting later than the
last), N tasks (default 100,000):

- **batonq**: ``batonq enqueue bench:workers --no-keys --from tasks.jsonl``
  (N lines of ``{"payload": {"n": i}}``), ``VACUUM ANALYZE`` (analyzed case), then ``batonq
  worker batonq_noop:app --burst --concurrency 200`` (an ``async`` no-op
  handler, ``bench/peers/batonq_noop.py``) with the default log level, its
  stderr to a file as a terminal or a log collector would take it;
- **PgQueuer** 1.6: N jobs through its client, ``VACUUM ANALYZE`` (analyzed case), then its
  worker in drain mode (``bench/peers/pgqueuer_noop.py work BATCH
  MANAGERS``: MANAGERS queue managers in one process, each on its own
  connection; by default batch 100 and batch 1000, 5 managers each, the
  best settings found here; ratios are to the better one);
- **raw**: N rows loaded into ``bench_core.py``'s plain table, then its
  claim/complete loop as a process (``bench/peers/raw_loop.py``: batch 100,
  one connection).

Each rate is N / (spawn -> exit): start-up, imports and connecting
included. Also kept: the worker's CPU time per task (user + system, its
child processes included), the server's (its backends on the scratch
database, read from ``/proc``: the server must run on this machine) and,
for batonq, the ``enqueue --from`` rate.

Usage::

    .venv/bin/python bench/bench_userpath.py             # 3 runs of 100,000 tasks (~15 min here)
    .venv/bin/python bench/bench_userpath.py --quick     # smoke: 1 run of 2,000
    .venv/bin/python bench/bench_userpath.py --batonq "--processes 2" --batonq ""

Results go to ``bench/results/userpath-<timestamp>.json``; a table gives the
median, min-max and each setting's ratio to PgQueuer's and the raw loop's
medians in the same case.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from bench_workers import PEERS_DIR, PgQueuer, _with_db
from psycopg.conninfo import conninfo_to_dict

import batonq
from batonq.benchmark import Baseline, Batonq, batonq_source, machine_info, postgres_info, scratch_database
from batonq.benchmark.targets import BASELINE_SCHEMA

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
QUEUE = "bench:workers"  # batonq_noop's
DEFAULT_BATONQ = ("", "--log-level warning", "--processes 2")
DEFAULT_PGQUEUER = ("100x5", "1000x5")
CASES = ("new database", "analyzed")  # in this order, every run


@dataclass(frozen=True)
class Setting:
    system: str  # batonq, pgqueuer, raw
    label: str
    args: tuple[str, ...] = ()
    case: str = CASES[0]

    @property
    def name(self) -> str:
        return f"{self.case}: {self.label}"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class ServerCpu:
    """The CPU time of the server processes serving one database while it
    runs, read from ``/proc`` (so only with the server on this machine):
    its backends are looked up every 0.2 s, each one's last reading kept."""

    def __init__(self, dsn: str | None) -> None:
        self.dsn = dsn
        self.ticks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ServerCpu:
        if self.dsn is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        assert self.dsn is not None
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.wait(0.2):
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid()"
                ).fetchall()
                for (pid,) in rows:
                    try:
                        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except (FileNotFoundError, ProcessLookupError):
                        continue
                    self.ticks[pid] = int(fields[11]) + int(fields[12])  # utime + stime

    def seconds(self) -> float | None:
        return sum(self.ticks.values()) / os.sysconf("SC_CLK_TCK") if self.ticks else None


def _timed(
    cmd: Sequence[str], env: dict[str, str], log: Path, deadline: float, server: str | None = None
) -> tuple[float, float, float | None]:
    """Run ``cmd`` to its exit: (wall seconds, CPU seconds of it and its
    children, CPU seconds of the server's backends on database ``server``
    when given and readable); its stderr goes to ``log``."""
    cpu = _children_cpu()
    with log.open("w") as err, ServerCpu(server) as backends:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=PEERS_DIR, stdout=subprocess.DEVNULL, stderr=err)
        try:
            code = proc.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{shlex.join(cmd)}: still running after {deadline} s") from None
        took = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {code}: {log.read_text()[-3000:]}")
    return took, _children_cpu() - cpu, backends.seconds()


class Bench:
    def __init__(self, args: argparse.Namespace, dsn: str, pgq: PgQueuer | None, work: Path) -> None:
        self.args = args
        self.n: int = args.tasks
        self.dsn = dsn
        self.pgq = pgq
        self.work = work
        # $PYTHONPATH kept after the handlers' directory: another checkout's src/ runs as batonq.
        path = os.pathsep.join(p for p in (str(PEERS_DIR), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, "BENCH_DSN": dsn, "PYTHONPATH": path}
        self.jsonl = work / "tasks.jsonl"
        with self.jsonl.open("w") as out:
            out.writelines(f'{{"payload": {{"n": {i}}}}}\n' for i in range(self.n))

    def _new_database(self, dsn: str) -> None:
        """Drop and make ``dsn``'s database again: no statistics left."""
        name = conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(self.args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')

    def fresh(self, system: str) -> None:
        """A new database for the step of ``system`` (the new-database case)."""
        if system == "pgqueuer":
            assert self.pgq is not None
            self._new_database(self.pgq.dsn)
            self.pgq.install()
            return
        self._new_database(self.dsn)
        batonq.migrate(self.dsn)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(BASELINE_SCHEMA)

    def _one(self, sql: str) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
            assert row is not None
            return int(row[0])

    def batonq(self, setting: Setting) -> dict[str, Any]:
        target = Batonq(self.dsn)
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            target.reset(admin)
        cli = [sys.executable, "-m", "batonq", "--dsn", self.dsn]
        load_s, _, _ = _timed(
            [*cli, "enqueue", QUEUE, "--no-keys", "--from", str(self.jsonl)],
            self.env,
            self.work / "enqueue.log",
            self.args.deadline,
        )
        if setting.case == "analyzed":
            with psycopg.connect(self.dsn, autocommit=True) as admin:
                target.vacuum(admin)
        log = self.work / "batonq.log"
        cmd = [
            *cli,
            "worker",
            "batonq_noop:app",
            "--burst",
            "--concurrency",
            str(self.args.concurrency),
            *setting.args,
        ]
        took, cpu, server = _timed(cmd, self.env, log, self.args.deadline, self.dsn)
        done = self._one("SELECT count(*) FROM batonq.archive WHERE state = 'done'")
        if done != self.n:
            raise RuntimeError(f"batonq {setting.label}: {done} of {self.n} tasks done")
        return {
            "seconds": took,
            "cpu_s": cpu,
            "server_cpu_s": server,
            "enqueue_from_per_s": self.n / load_s,
            "log_lines": sum(1 for _ in log.open()),
        }

    def pgqueuer(self, setting: Setting) -> dict[str, Any]:
        assert self.pgq is not None
        self.pgq.enqueue(self.n, 1000)
        if setting.case == "analyzed":
            with psycopg.connect(self.pgq.dsn, autocommit=True) as admin:
                admin.execute("VACUUM (ANALYZE) pgqueuer")
        cmd = [self.pgq.python(), "pgqueuer_noop.py", "work", *setting.args]
        took, cpu, server = _timed(
            cmd, self.pgq.env, self.work / "pgqueuer.log", self.args.deadline, self.pgq.dsn
        )
        with psycopg.connect(self.pgq.dsn, autocommit=True) as admin:
            row = admin.execute("SELECT count(*) FROM pgqueuer").fetchone()
        if row is None or row[0] != 0:
            raise RuntimeError(f"pgqueuer {setting.label}: {row} jobs left")
        return {"seconds": took, "cpu_s": cpu, "server_cpu_s": server}

    def raw(self, setting: Setting) -> dict[str, Any]:
        target = Baseline(self.dsn)
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            target.reset(admin)
            target.preload(admin, self.n)
            if setting.case == "analyzed":
                target.vacuum(admin)
        cmd = [sys.executable, "raw_loop.py", *setting.args]
        took, cpu, server = _timed(cmd, self.env, self.work / "raw.log", self.args.deadline, self.dsn)
        done = self._one("SELECT count(*) FROM public.bench_tasks WHERE state = 'done'")
        if done != self.n:
            raise RuntimeError(f"raw loop: {done} of {self.n} tasks done")
        return {"seconds": took, "cpu_s": cpu, "server_cpu_s": server}


def settings(args: argparse.Namespace, peers: bool) -> list[Setting]:
    found = [Setting("batonq", f"batonq {extra}".strip(), tuple(shlex.split(extra))) for extra in args.batonq]
    if peers:
        for spec in args.pgqueuer:
            batch, managers = spec.split("x")
            found.append(
                Setting("pgqueuer", f"pgqueuer batch {batch}, {managers} managers", (batch, managers))
            )
    found.append(Setting("raw", "raw loop, batch 100", ("100",)))
    return [Setting(s.system, s.label, s.args, case) for case in CASES for s in found]


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    pgq = PgQueuer(Path(args.pgqueuer_venv))
    skipped = {} if args.no_peers else ({"pgqueuer": why} if (why := pgq.available()) else {})
    peers = not args.no_peers and not skipped
    chosen = settings(args, peers)
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in chosen}
    pgq_db = f"batonq_bench_userpath_pgq_{os.getpid()}"
    with scratch_database(args.dsn) as dsn, tempfile.TemporaryDirectory() as work:
        try:
            if peers:
                with psycopg.connect(args.dsn, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{pgq_db}" WITH (FORCE)')
                    admin.execute(f'CREATE DATABASE "{pgq_db}"')
                pgq.bind(_with_db(args.dsn, pgq_db))
                pgq.install()
            bench = Bench(args, dsn, pgq if peers else None, Path(work))
            with psycopg.connect(dsn) as conn:
                server = postgres_info(conn)
            for number in range(args.runs):
                for case in CASES:
                    # Each round starts one setting later: none always runs
                    # first or right after the same one.
                    these = [s for s in chosen if s.case == case]
                    turn = number % len(these)
                    for setting in these[turn:] + these[:turn]:
                        if case == "new database":
                            bench.fresh(setting.system)
                        result = getattr(bench, setting.system)(setting)
                        result["per_s"] = args.tasks / result["seconds"]
                        result["cpu_us_per_task"] = result["cpu_s"] / args.tasks * 1e6
                        server_s = result["server_cpu_s"]
                        result["server_cpu_us_per_task"] = server_s / args.tasks * 1e6 if server_s else None
                        runs[setting.name].append(result)
                        print(
                            f"run {number + 1}/{args.runs} {setting.name:<52}"
                            f" {result['per_s']:>9,.0f} tasks/s"
                            f"  CPU µs/task: worker {result['cpu_us_per_task']:>5.1f}"
                            f", server {result['server_cpu_us_per_task'] or 0:>5.1f}",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            if peers:
                with psycopg.connect(args.dsn, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{pgq_db}" WITH (FORCE)')
    summary = {
        label: {
            "per_s": _stats([r["per_s"] for r in results]),
            "cpu_us_per_task": _stats([r["cpu_us_per_task"] for r in results]),
            "server_cpu_us_per_task": _stats([r["server_cpu_us_per_task"] for r in results])
            if all(r["server_cpu_us_per_task"] for r in results)
            else None,
        }
        for label, results in runs.items()
    }
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "postgres": server,
        "batonq": batonq_source(),
        "pgqueuer": pgq.version() if peers else None,
        "skipped": skipped,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "settings": [s.__dict__ for s in chosen],
        "runs": runs,
        "summary": summary,
        "ratios": ratios(summary),
    }


def ratios(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each batonq setting's median over the best PgQueuer setting's and the
    raw loop's medians of the same case."""
    found: dict[str, dict[str, float]] = {}
    for case in CASES:
        median = {
            label.removeprefix(f"{case}: "): s["per_s"]["median"]
            for label, s in summary.items()
            if label.startswith(f"{case}: ")
        }
        peers = [v for label, v in median.items() if label.startswith("pgqueuer")]
        raw = [v for label, v in median.items() if label.startswith("raw")]
        for label, value in median.items():
            if not label.startswith("batonq"):
                continue
            mine = found[f"{case}: {label}"] = {}
            if peers:
                mine["pgqueuer"] = value / max(peers)
            if raw:
                mine["raw"] = value / raw[0]
    return found


def print_table(report: dict[str, Any]) -> None:
    print(
        "\ntasks/s, spawn to exit (median [min-max]); CPU µs per task: the worker's process(es), the server's"
    )
    print(
        f"| {'setting':<52} | {'tasks/s':>8} | {'min-max':>15} | {'worker µs':>9} | {'server µs':>9}"
        f" | {'/ PgQueuer':>10} | {'/ raw':>5} |"
    )
    for label, s in report["summary"].items():
        r = report["ratios"].get(label, {})
        cells = [f"{r[k]:.2f}" if k in r else "" for k in ("pgqueuer", "raw")]
        server = f"{s['server_cpu_us_per_task']['median']:.1f}" if s["server_cpu_us_per_task"] else "n/a"
        print(
            f"| {label:<52} | {s['per_s']['median']:>8,.0f}"
            f" | {s['per_s']['min']:>6,.0f}-{s['per_s']['max']:<8,.0f}"
            f" | {s['cpu_us_per_task']['median']:>9.1f} | {server:>9} | {cells[0]:>10} | {cells[1]:>5} |"
        )
    loads = [
        r["enqueue_from_per_s"] for rs in report["runs"].values() for r in rs if "enqueue_from_per_s" in r
    ]
    if loads:
        s = _stats(loads)
        print(f"\nbatonq enqueue --from: {s['median']:,.0f} tasks/s [{s['min']:,.0f}-{s['max']:,.0f}]")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dsn", default=DEFAULT_DSN, help="a server, by one of its databases (default %(default)s)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke: 1 run of 2,000 tasks, one setting of each system"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks per run (default %(default)s)")
    parser.add_argument(
        "--concurrency", type=int, default=200, help="batonq worker --concurrency (default %(default)s)"
    )
    parser.add_argument(
        "--batonq",
        action="append",
        metavar="OPTIONS",
        help="`batonq worker` options of a setting, repeatable"
        " (default: none, --log-level warning, --processes 2)",
    )
    parser.add_argument(
        "--pgqueuer",
        action="append",
        metavar="BATCHxMANAGERS",
        help="a PgQueuer setting, repeatable (default: 100x5 and 1000x5)",
    )
    parser.add_argument("--pgqueuer-venv", default="/tmp/peer-pgqueuer")
    parser.add_argument("--no-peers", action="store_true", help="leave PgQueuer out")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds a step may take")
    parser.add_argument(
        "--out", default="", help="JSON path (default bench/results/userpath-<timestamp>.json)"
    )
    args = parser.parse_args(argv)
    if args.quick:  # one setting of each system unless named
        args.runs, args.tasks = 1, 2_000
        args.batonq = args.batonq if args.batonq is not None else list(DEFAULT_BATONQ[:1])
        args.pgqueuer = args.pgqueuer or list(DEFAULT_PGQUEUER[:1])
    args.batonq = args.batonq if args.batonq is not None else list(DEFAULT_BATONQ)
    args.pgqueuer = args.pgqueuer or list(DEFAULT_PGQUEUER)
    report = run(args)
    out = Path(args.out) if args.out else RESULTS_DIR / f"userpath-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print_table(report)
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
