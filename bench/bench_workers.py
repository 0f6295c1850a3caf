#!/usr/bin/env python3
"""Worker throughput end to end: batonq against PgQueuer and Procrastinate.

For each system the benchmark creates its own scratch database
(``batonq_bench_workers_<system>_<pid>``), installs that system's schema, and
then, run by run (the systems alternate, so a noisy machine hurts them alike):

1. enqueues N no-op jobs, timed: a tenth one per call, the rest 100 per call
   (each system's own client: batonq ``enqueue`` / ``enqueue_many``, PgQueuer
   ``Queries.enqueue``, Procrastinate ``batch_defer_async``), then ``VACUUM
   ANALYZE``;
2. starts the system's worker as a subprocess with a no-op async handler
   (batonq also with a no-op sync handler, which runs in its threads);
3. polls the database every ``--poll`` seconds until no job is left
   (deadline ``--deadline``), and waits for the worker to exit.

Two rates per run, in jobs per second:

- ``total``: N / (worker spawn -> last job done), process start-up included;
- ``steady``: jobs done after the first completion was seen / the time from
  then to the last one (start-up, imports and connecting excluded).

The peers run from their own virtualenvs (never batonq's)::

    python3 -m venv /tmp/peer-pgqueuer && /tmp/peer-pgqueuer/bin/pip install pgqueuer asyncpg
    python3 -m venv /tmp/peer-procrastinate
    /tmp/peer-procrastinate/bin/pip install procrastinate 'psycopg[binary]'

Their handler modules are in ``bench/peers/``. A peer whose virtualenv is
missing is skipped and reported as such.

Usage::

    .venv/bin/python bench/bench_workers.py            # full: 3 runs (~3 min)
    .venv/bin/python bench/bench_workers.py --quick    # smoke: 1 run, few jobs
    .venv/bin/python bench/bench_workers.py --only batonq,pgqueuer --runs 5

Results go to ``bench/results/workers-<timestamp>.json``; a table is printed
with the median, min-max and the ratio batonq / peer of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

import batonq

BENCH_DIR = Path(__file__).resolve().parent
PEERS_DIR = BENCH_DIR / "peers"
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BATONQ_QUEUE = "bench:workers"
PROCRASTINATE_QUEUE = "bench_workers"


def _with_db(dsn: str, dbname: str) -> str:
    """The same server as ``dsn`` (a postgresql:// URL: asyncpg takes no
    other form), database ``dbname``."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise SystemExit(f"--dsn must be a postgresql:// URL, not {dsn!r}")
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def _run(cmd: Sequence[str], env: dict[str, str]) -> str:
    done = subprocess.run(cmd, env=env, cwd=PEERS_DIR, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


# --------------------------------------------------------------------------
# The systems


@dataclass
class System:
    """A queue with a schema, a batch enqueuer and a worker command."""

    name: str
    venv: Path | None  # None: batonq's own interpreter
    tables: tuple[str, ...]
    remaining_sql: str
    env: dict[str, str] = field(default_factory=dict)
    dsn: str = ""

    def python(self) -> str:
        return sys.executable if self.venv is None else str(self.venv / "bin" / "python")

    def available(self) -> str | None:
        """None when usable, else why not."""
        if self.venv is not None and not (self.venv / "bin" / "python").exists():
            return f"no virtualenv at {self.venv}"
        return None

    def bind(self, dsn: str) -> None:
        self.dsn = dsn
        self.env = {**os.environ, "BENCH_DSN": dsn, "PYTHONPATH": str(PEERS_DIR)}

    def install(self) -> None:
        raise NotImplementedError

    def enqueue(self, n: int, batch: int) -> float:
        """Enqueue n jobs, ``batch`` per call (1: the single-job call); the
        seconds the calls took (connecting and imports excluded)."""
        raise NotImplementedError

    def worker(self, setting: Setting) -> list[str]:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError


class Batonq(System):
    def __init__(self) -> None:
        super().__init__(
            "batonq", None, ("batonq.tasks", "batonq.archive"),
            f"SELECT count(*) FROM batonq.tasks WHERE queue = '{BATONQ_QUEUE}'",
        )  # fmt: skip

    def install(self) -> None:
        batonq.migrate(self.dsn)

    def enqueue(self, n: int, batch: int) -> float:
        with batonq.connect(self.dsn, listen=False) as client:
            started = time.perf_counter()
            if batch == 1:
                for i in range(n):
                    client.enqueue(BATONQ_QUEUE, {"n": i})
                return time.perf_counter() - started
            done = 0
            while done < n:
                size = min(batch, n - done)
                client.enqueue_many(BATONQ_QUEUE, [{"n": i} for i in range(done, done + size)])
                done += size
            return time.perf_counter() - started

    def worker(self, setting: Setting) -> list[str]:
        app = "batonq_noop:sync_app" if setting.sync else "batonq_noop:app"
        return [
            sys.executable, "-m", "batonq", "--dsn", self.dsn, "worker", app,
            "--queues", BATONQ_QUEUE, "--burst", "-c", str(setting.value), "--no-sweeper",
            "--log-level", "warning",
        ]  # fmt: skip

    def version(self) -> str:
        return getattr(batonq, "__version__", "?")


class PgQueuer(System):
    def __init__(self, venv: Path) -> None:
        super().__init__("pgqueuer", venv, ("pgqueuer",), "SELECT count(*) FROM pgqueuer")

    def install(self) -> None:
        assert self.venv is not None
        _run([str(self.venv / "bin" / "pgq"), "--pg-dsn", self.dsn, "install"], self.env)

    def enqueue(self, n: int, batch: int) -> float:
        return float(_run([self.python(), "pgqueuer_noop.py", "enqueue", str(n), str(batch)], self.env))

    def worker(self, setting: Setting) -> list[str]:
        # Its own QueueManager in drain mode via PgQueuer.run(); `pgq run` fails
        # at start in pgqueuer 1.6 here (setup_fancy_logger: 'str' has no 'name').
        return [self.python(), "pgqueuer_noop.py", "work", str(setting.value)]

    def version(self) -> str:
        return _pip_version(self, "pgqueuer")


class Procrastinate(System):
    def __init__(self, venv: Path) -> None:
        super().__init__(
            "procrastinate", venv, ("procrastinate_jobs",),
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
        )  # fmt: skip

    def _cli(self) -> list[str]:
        assert self.venv is not None
        return [str(self.venv / "bin" / "procrastinate"), "--app", "procrastinate_noop.app"]

    def install(self) -> None:
        _run([*self._cli(), "schema", "--apply"], self.env)

    def enqueue(self, n: int, batch: int) -> float:
        return float(_run([self.python(), "procrastinate_noop.py", "enqueue", str(n), str(batch)], self.env))

    def worker(self, setting: Setting) -> list[str]:
        return [*self._cli(), "worker", "-q", PROCRASTINATE_QUEUE, "-c", str(setting.value), "--one-shot"]

    def version(self) -> str:
        return _pip_version(self, "procrastinate")


def _pip_version(system: System, package: str) -> str:
    done = subprocess.run(
        [system.python(), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or "?"


# --------------------------------------------------------------------------
# One measured run


def _tail(errors: Any) -> str:
    errors.seek(0)
    return str(errors.read())[-3000:]


@dataclass(frozen=True)
class Setting:
    system: str
    label: str  # e.g. "-c 200", "batch 100"
    value: int
    slow: bool = False  # uses --slow-jobs (a system ~10x slower than the others)
    sync: bool = False  # batonq: the sync handler (threads) instead of the async one


SETTINGS: tuple[Setting, ...] = (  # batonq's come from --batonq-c
    Setting("pgqueuer", "batch 10 (default)", 10),
    Setting("pgqueuer", "batch 100", 100),
    Setting("procrastinate", "concurrency 1 (default)", 1, slow=True),
    Setting("procrastinate", "concurrency 10", 10, slow=True),
)


def measure(system: System, setting: Setting, n: int, *, poll: float, deadline: float) -> dict[str, Any]:
    # The jobs go in timed: a tenth one per call, the rest 100 per call.
    singles = max(1, n // 10)
    single_s = system.enqueue(singles, 1)
    batch_s = system.enqueue(n - singles, 100)
    with psycopg.connect(system.dsn, autocommit=True) as conn, tempfile.TemporaryFile("w+") as errors:
        for table in system.tables:
            conn.execute(f"VACUUM (ANALYZE) {table}")

        def remaining() -> int:
            row = conn.execute(system.remaining_sql).fetchone()
            assert row is not None
            return int(row[0])

        before = remaining()
        if before != n:
            raise RuntimeError(f"{system.name}: {before} jobs waiting after enqueueing {n}")
        start = time.perf_counter()
        proc = subprocess.Popen(
            system.worker(setting), env=system.env, cwd=PEERS_DIR,
            stdout=subprocess.DEVNULL, stderr=errors, text=True,
        )  # fmt: skip
        first_at: float | None = None
        first_done = 0
        left = n
        try:
            while True:
                left = remaining()
                now = time.perf_counter()
                if first_at is None and left < n:
                    first_at, first_done = now, n - left
                if left == 0:
                    end = now
                    break
                if now - start > deadline:
                    raise RuntimeError(
                        f"{system.name} {setting.label}: {left} of {n} left after {deadline} s"
                    )
                if proc.poll() is not None and proc.returncode != 0:
                    raise RuntimeError(f"{system.name} worker exited {proc.returncode}: {_tail(errors)}")
                time.sleep(poll)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.terminate()
                rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert first_at is not None
    steady_time = end - first_at
    return {
        "jobs": n,
        "seconds": end - start,
        "total_per_s": n / (end - start),
        "steady_per_s": (n - first_done) / steady_time if steady_time > 0 else None,
        "startup_s": first_at - start,
        "exit_code": rc,
        "enqueue_b1_per_s": singles / single_s,
        "enqueue_b100_per_s": (n - singles) / batch_s,
    }


# --------------------------------------------------------------------------
# Entry points


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _steady_stats(results: list[dict[str, Any]]) -> dict[str, float] | None:
    """None when every run drained between two polls: too few jobs to tell."""
    steady = [r["steady_per_s"] for r in results if r["steady_per_s"]]
    return _stats(steady) if steady else None


def _ints(csv: str) -> list[int]:
    return [int(c) for c in csv.split(",") if c.strip()]


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    systems: dict[str, System] = {
        "batonq": Batonq(),
        "pgqueuer": PgQueuer(Path(args.pgqueuer_venv)),
        "procrastinate": Procrastinate(Path(args.procrastinate_venv)),
    }
    wanted = [s.strip() for s in args.only.split(",")] if args.only else list(systems)
    skipped: dict[str, str] = {}
    active: dict[str, System] = {}
    for name in wanted:
        why = systems[name].available()
        if why:
            skipped[name] = why
            print(f"skipping {name}: {why}", file=sys.stderr)
        else:
            active[name] = systems[name]
    batonq_c = _ints(args.batonq_c)
    settings = [
        *(Setting("batonq", f"-c {c}" + (" (default)" if c == 10 else ""), c) for c in batonq_c),
        *(Setting("batonq", f"-c {c} sync handler", c, sync=True) for c in _ints(args.batonq_sync_c)),
        *(s for s in SETTINGS if s.system != "batonq"),
    ]
    settings = [s for s in settings if s.system in active]
    runs: dict[str, list[dict[str, Any]]] = {f"{s.system} {s.label}": [] for s in settings}
    created: list[str] = []
    try:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            for name, system in active.items():
                db = f"batonq_bench_workers_{name}_{os.getpid()}"
                admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{db}"')
                created.append(db)
                system.bind(_with_db(args.dsn, db))
                system.install()
        versions = {name: system.version() for name, system in active.items()}
        for run in range(args.runs):
            for setting in settings:
                n = args.slow_jobs if setting.slow else args.jobs
                result = measure(active[setting.system], setting, n, poll=args.poll, deadline=args.deadline)
                key = f"{setting.system} {setting.label}"
                runs[key].append(result)
                print(
                    f"run {run + 1}/{args.runs} {key:<40} {result['total_per_s']:>9,.0f} total/s"
                    f" {result['steady_per_s'] or 0:>9,.0f} steady/s  start-up {result['startup_s']:.2f} s",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
    finally:
        if not args.keep:
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                for db in created:
                    admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    summary = {
        key: {
            "total_per_s": _stats([r["total_per_s"] for r in results]),
            "steady_per_s": _steady_stats(results),
            "startup_s": _stats([r["startup_s"] for r in results]),
        }
        for key, results in runs.items()
        if results
    }
    enqueue = {
        name: {
            metric: _stats([r[metric] for key, results in runs.items() if key.startswith(f"{name} ")
                            for r in results])
            for metric in ("enqueue_b1_per_s", "enqueue_b100_per_s")
        }
        for name in active
    }  # fmt: skip
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": versions,
        "skipped": skipped,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": runs,
        "summary": summary,
        "enqueue": enqueue,
    }


def print_table(report: dict[str, Any], out: Callable[[str], None] = print) -> None:
    summary = report["summary"]
    batonq_keys = [k for k in summary if k.startswith("batonq ")]
    peer_keys = [k for k in summary if not k.startswith("batonq ")]
    for metric in ("steady_per_s", "total_per_s"):
        out(f"\n{metric} (median [min-max]); ratio = batonq / peer, medians")
        header = f"| {'system':<40} | {'median':>8} | {'min-max':>17} |"
        header += "".join(f" {k.removeprefix('batonq '):>16} |" for k in batonq_keys)
        out(header)
        for key in summary:
            s = summary[key][metric]
            if s is None:
                out(f"| {key:<40} | {'n/a':>8} | {'':>17} |")
                continue
            row = f"| {key:<40} | {s['median']:>8,.0f} | {s['min']:>7,.0f}-{s['max']:<9,.0f} |"
            for b in batonq_keys:
                if summary[b][metric] is None:
                    row += f" {'n/a':>16} |"
                    continue
                ratio = summary[b][metric]["median"] / s["median"]
                row += f" {ratio:>16.2f} |" if key in peer_keys else f" {'':>16} |"
            out(row)


def print_enqueue_table(report: dict[str, Any], out: Callable[[str], None] = print) -> None:
    enqueue = report["enqueue"]
    out("\nenqueue jobs/s (median [min-max] over every run of the system); ratio = batonq / peer")
    out(f"| {'system':<14} | {'1 per call':>22} | {'100 per call':>24} | {'ratio 1':>7} | {'ratio 100':>9} |")
    for name, rates in enqueue.items():
        cells = []
        for metric in ("enqueue_b1_per_s", "enqueue_b100_per_s"):
            s = rates[metric]
            cells.append(f"{s['median']:,.0f} [{s['min']:,.0f}-{s['max']:,.0f}]")
        ratios = ["", ""]
        if name != "batonq" and "batonq" in enqueue:
            ratios = [f"{enqueue['batonq'][m]['median'] / rates[m]['median']:.2f}"
                      for m in ("enqueue_b1_per_s", "enqueue_b100_per_s")]  # fmt: skip
        out(f"| {name:<14} | {cells[0]:>22} | {cells[1]:>24} | {ratios[0]:>7} | {ratios[1]:>9} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--dsn", default=DEFAULT_DSN, help="a server, by one of its databases (default %(default)s)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke: 1 run, 2,000 jobs (200 for Procrastinate)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default %(default)s)")
    parser.add_argument("--slow-jobs", type=int, default=3_000,
                        help="jobs per run for Procrastinate (default %(default)s)")  # fmt: skip
    parser.add_argument("--only", default="", help="comma-separated: batonq,pgqueuer,procrastinate")
    parser.add_argument("--batonq-c", default="200,10", help="batonq worker -c values (default %(default)s)")
    parser.add_argument(
        "--batonq-sync-c", default="200",
        help="-c values for batonq with a sync handler ('' for none; default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--pgqueuer-venv", default="/tmp/peer-pgqueuer")
    parser.add_argument("--procrastinate-venv", default="/tmp/peer-procrastinate")
    parser.add_argument(
        "--poll", type=float, default=0.02, help="seconds between polls (default %(default)s)"
    )
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds per run before giving up")
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
    parser.add_argument(
        "--out", default="", help="JSON path (default bench/results/workers-<timestamp>.json)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.jobs, args.slow_jobs = 1, 2_000, 200
    report = run_benchmark(args)
    out = Path(args.out) if args.out else RESULTS_DIR / f"workers-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"versions: {report['versions']}  skipped: {report['skipped'] or 'none'}")
    print_table(report)
    print_enqueue_table(report)
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
