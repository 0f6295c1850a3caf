#!/usr/bin/env python3
"""Queue-graph throughput end to end: a 3-step pipeline against 3N independent tasks.

On a scratch database it creates (``batonq_bench_<pid>``, batonq.benchmark's
``scratch_database``; dropped afterwards unless ``--keep``), each run measures
two systems, one after the other (their order alternates run by run):

- ``graph``: the edges ``bench:a -> bench:b -> bench:c`` (``Client.add_edge``,
  whole result as the next payload); N root tasks in ``bench:a``. Each
  completion of an a-task makes the b-task, each b-task's the c-task, in the
  transaction that accepts the completion (docs/graph.md). A pipeline is done
  when its c-task is: N pipelines are 3N tasks run.
- ``baseline``: no edges; N tasks in each of the three queues, all enqueued up
  front with the payloads the graph's tasks would get, so the worker runs the
  same 3N handler calls with no hand-off.

Per run and system: the tables are emptied, the tasks enqueued in batches of
``--batch`` (untimed), ``VACUUM ANALYZE``, then ONE worker subprocess::

    python -m batonq --dsn DSN worker graph_app:app --queues bench:a,bench:b,bench:c
        --burst -c C --no-sweeper --log-level warning

(``bench/handlers/graph_app.py``: three async handlers that pass a small dict
along, each appending its step's letter to ``path``) drains the queues. The
database is polled every ``--poll`` seconds for the tasks still to run (graph:
a pending a-task still needs 3, a b-task 2, a c-task 1; baseline: 1 each)
until none is left. Then the results are checked, untimed, and the run fails
loudly if they are wrong: every task done once, none dead; graph: every c-task
``{"n": n, "path": ["a", "b", "c"]}``, its parent a b-task whose parent is the
a-task of root ``n`` (the run's root); all N roots there once.

Rates per run, as tasks/s and pipelines/s (= tasks/s / 3; for the baseline,
pipeline-equivalents of 3 tasks):

- ``total``: 3N tasks / (worker spawn -> last task done), start-up included;
- ``steady``: the tasks done after the first completion of ANY task (any
  queue) was seen / the time from then to the last one (start-up, imports and
  connecting excluded). For the graph this includes filling the pipeline: the
  first finished pipeline (first c-task done) is also recorded, as
  ``first_pipeline_s`` from spawn.

The report gives the median and min-max over ``--runs`` and the ratio
graph / baseline of the medians: the cost of the two hand-offs per pipeline.

Usage::

    .venv/bin/python bench/bench_graph.py               # full: 3 runs x 10,000 pipelines (~1-2 min)
    .venv/bin/python bench/bench_graph.py --quick       # smoke: 1 run, 300 pipelines
    .venv/bin/python bench/bench_graph.py --pipelines 20000 -c 50 --runs 5

Results go to ``bench/results/graph-<timestamp>.json`` (``--out`` another
directory) and a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

import batonq
from batonq.benchmark import batonq_source, git_commit, machine_info, postgres_info, scratch_database

BENCH_DIR = Path(__file__).resolve().parent
HANDLERS_DIR = BENCH_DIR / "handlers"
RESULTS_DIR = BENCH_DIR / "results"
DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
QUEUES = ("bench:a", "bench:b", "bench:c")
EDGES = (("bench:a", "bench:b"), ("bench:b", "bench:c"))
LETTERS = {"bench:a": "a", "bench:b": "b", "bench:c": "c"}
SYSTEMS = ("graph", "baseline")
# Tasks a pending task of each queue still stands for: in the graph an a-task
# becomes a b-task and then a c-task when it completes.
STEPS_LEFT = {
    "graph": {"bench:a": 3, "bench:b": 2, "bench:c": 1},
    "baseline": {"bench:a": 1, "bench:b": 1, "bench:c": 1},
}
TABLES = ("batonq.tasks", "batonq.archive", "batonq.submits", "batonq.idempotency_keys")


# --------------------------------------------------------------------------
# Setting up a run


def _payload(n: int, queue: str) -> dict[str, Any]:
    """What a task of ``queue`` gets for root ``n``: the path so far."""
    return {"n": n, "path": ["a", "b", "c"][: QUEUES.index(queue)]}


def reset(admin: psycopg.Connection[Any]) -> None:
    """Empty batonq's task tables: truncate just the partitions holding rows."""
    leaves: list[str] = []
    for table in TABLES:
        rows = admin.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {table}").fetchall()
        leaves += [str(leaf) for (leaf,) in rows]
    if leaves:
        admin.execute(f"TRUNCATE {', '.join(leaves)}")


def prepare(client: batonq.Client, admin: psycopg.Connection[Any], system: str, n: int, batch: int) -> None:
    """Empty tables, the edges ``system`` needs, its tasks enqueued, VACUUM ANALYZE."""
    reset(admin)
    for from_queue, to_queue in EDGES:
        if system == "graph":
            client.add_edge(from_queue, to_queue)
        else:
            client.remove_edge(from_queue, to_queue)
    for queue in QUEUES if system == "baseline" else QUEUES[:1]:
        for start in range(0, n, batch):
            client.enqueue_many(queue, [_payload(i, queue) for i in range(start, min(n, start + batch))])
    for table in TABLES:
        admin.execute(f"VACUUM (ANALYZE) {table}")
    left = tasks_left(admin, system)
    if left != 3 * n:
        raise RuntimeError(f"{system}: {left} tasks to run after enqueueing, expected {3 * n}")


def tasks_left(admin: psycopg.Connection[Any], system: str) -> int:
    """How many handler runs are still to come (see STEPS_LEFT)."""
    rows = admin.execute("SELECT queue, count(*) FROM batonq.tasks GROUP BY queue").fetchall()
    weights = STEPS_LEFT[system]
    unknown = [queue for queue, _ in rows if queue not in weights]
    if unknown:
        raise RuntimeError(f"tasks in unexpected queues: {unknown}")
    return sum(weights[queue] * int(count) for queue, count in rows)


# --------------------------------------------------------------------------
# One measured run


@dataclass
class Progress:
    """What the polls saw, in perf_counter seconds."""

    start: float
    first_at: float | None = None  # first completion of any task seen
    left_at_first: int = 0
    first_pipeline_at: float | None = None  # graph: first c-task done seen
    end: float = 0.0
    polls: int = 0


def _tail(errors: IO[str]) -> str:
    errors.seek(0)
    return errors.read()[-3000:]


def watch(
    admin: psycopg.Connection[Any],
    system: str,
    n: int,
    proc: subprocess.Popen[str],
    errors: IO[str],
    progress: Progress,
    *,
    poll: float,
    deadline: float,
) -> None:
    """Poll until no task is left to run; raise if the worker stops early."""
    total = 3 * n
    while True:
        exited = proc.poll() is not None  # before the count: a count after exit is final
        left = tasks_left(admin, system)
        now = time.perf_counter()
        progress.polls += 1
        if progress.first_at is None and left < total:
            progress.first_at, progress.left_at_first = now, left
        if system == "graph" and progress.first_pipeline_at is None:
            # Graph: every unfinished pipeline has exactly one task in batonq.tasks.
            row = admin.execute("SELECT count(*) FROM batonq.tasks").fetchone()
            if row is not None and int(row[0]) < n:
                progress.first_pipeline_at = now
        if left == 0:
            progress.end = now
            return
        if exited:
            why = f"worker exited {proc.returncode} with {left} of {total} tasks left"
            raise RuntimeError(f"{system}: {why}:\n{_tail(errors)}")
        if now - progress.start > deadline:
            raise RuntimeError(f"{system}: {left} of {total} tasks left after {deadline} s")
        time.sleep(poll)


def worker_command(dsn: str, concurrency: int) -> list[str]:
    return [
        sys.executable, "-m", "batonq", "--dsn", dsn, "worker", "graph_app:app",
        "--queues", ",".join(QUEUES), "--burst", "-c", str(concurrency), "--no-sweeper",
        "--log-level", "warning",
    ]  # fmt: skip


def measure(
    dsn: str, admin: psycopg.Connection[Any], system: str, n: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Start the worker, watch it drain the 3N tasks, wait for it to exit."""
    path = [str(HANDLERS_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    with tempfile.TemporaryFile("w+") as errors:
        progress = Progress(start=time.perf_counter())
        proc = subprocess.Popen(
            worker_command(dsn, args.concurrency), env=env, cwd=HANDLERS_DIR,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, text=True,
        )  # fmt: skip
        try:
            watch(admin, system, n, proc, errors, progress, poll=args.poll, deadline=args.deadline)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.terminate()
                rc = proc.wait(timeout=30)
            if rc != 0:
                raise RuntimeError(f"{system}: worker exited {rc} after draining:\n{_tail(errors)}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rates(system, n, progress)


def rates(system: str, n: int, progress: Progress) -> dict[str, Any]:
    assert progress.first_at is not None
    total = 3 * n
    seconds = progress.end - progress.start
    steady_s = progress.end - progress.first_at
    steady = progress.left_at_first / steady_s if steady_s > 0 else None
    first_pipeline = progress.first_pipeline_at
    return {
        "pipelines": n,
        "tasks": total,
        "seconds": seconds,
        "total_tasks_per_s": total / seconds,
        "total_pipelines_per_s": n / seconds,
        "steady_tasks_per_s": steady,
        "steady_pipelines_per_s": steady / 3 if steady is not None else None,
        "steady_tasks": progress.left_at_first,
        "startup_s": progress.first_at - progress.start,
        "first_pipeline_s": first_pipeline - progress.start if first_pipeline is not None else None,
        "polls": progress.polls,
    }


# --------------------------------------------------------------------------
# Checking the results


def _check_counts(admin: psycopg.Connection[Any], system: str, n: int, problems: list[str]) -> None:
    row = admin.execute("SELECT count(*) FROM batonq.tasks").fetchone()
    if row is None or row[0] != 0:
        problems.append(f"{row and row[0]} tasks not finished")
    found = {
        (queue, state): (int(count), int(children))
        for queue, state, count, children in admin.execute(
            "SELECT queue, state, count(*), count(parent_id) FROM batonq.archive GROUP BY queue, state"
        ).fetchall()
    }
    expected = {
        ("bench:a", "done"): (n, 0),
        ("bench:b", "done"): (n, n if system == "graph" else 0),
        ("bench:c", "done"): (n, n if system == "graph" else 0),
    }
    if found != expected:
        problems.append(f"finished (queue, state): (tasks, with a parent) = {found}, expected {expected}")


def _check_results(admin: psycopg.Connection[Any], n: int, problems: list[str]) -> None:
    """Every task's result is its payload with its step appended; every root once per queue."""
    seen: dict[str, list[int]] = {queue: [] for queue in QUEUES}
    for task_id, queue, payload, result in admin.execute(
        "SELECT id, queue, payload, result FROM batonq.archive"
    ).fetchall():
        k = payload.get("n") if isinstance(payload, dict) else None
        if not isinstance(k, int) or queue not in seen:
            problems.append(f"task {task_id} in {queue}: unexpected payload {payload!r}")
            continue
        seen[queue].append(k)
        want = {"n": k, "path": ["a", "b", "c"][: QUEUES.index(queue) + 1]}
        if payload != _payload(k, queue) or result != want:
            problems.append(f"task {task_id} in {queue}: {payload!r} -> {result!r}, expected {want!r}")
    for queue, ks in seen.items():
        if sorted(ks) != list(range(n)):
            problems.append(f"{queue}: {len(ks)} results of {len(set(ks))} distinct roots, not 0..{n - 1}")


def _check_lineage(admin: psycopg.Connection[Any], n: int, problems: list[str]) -> None:
    """Graph: each c-task came from a b-task that came from the run's root a-task."""
    chains = admin.execute(
        """
        SELECT c.id, c.result, a.payload
          FROM batonq.archive c
          JOIN batonq.archive b ON b.id = c.parent_id AND b.queue = 'bench:b'
          JOIN batonq.archive a ON a.id = b.parent_id AND a.queue = 'bench:a'
         WHERE c.queue = 'bench:c' AND c.root_id = a.id AND b.root_id = a.id AND a.root_id = a.id
        """
    ).fetchall()
    roots = sorted(payload["n"] for _, _, payload in chains)
    if roots != list(range(n)):
        problems.append(f"{len(chains)} c-tasks trace back through a b-task to their root, expected {n}")
    for task_id, result, payload in chains:
        if result != {"n": payload["n"], "path": ["a", "b", "c"]}:
            problems.append(f"c-task {task_id} of root n={payload['n']}: result {result!r}")


def verify(admin: psycopg.Connection[Any], system: str, n: int) -> None:
    """Raise unless the run did exactly what it should have (see the module doc)."""
    problems: list[str] = []
    _check_counts(admin, system, n, problems)
    _check_results(admin, n, problems)
    if system == "graph":
        _check_lineage(admin, n, problems)
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise RuntimeError(f"{system}: WRONG RESULTS ({len(problems)} problems):\n  {shown}{more}")


# --------------------------------------------------------------------------
# Entry points


def _stats(values: Sequence[float | None]) -> dict[str, float] | None:
    found = [v for v in values if v is not None]
    if not found:
        return None
    return {"median": statistics.median(found), "min": min(found), "max": max(found)}


METRICS = (
    "steady_pipelines_per_s",
    "total_pipelines_per_s",
    "steady_tasks_per_s",
    "total_tasks_per_s",
    "startup_s",
    "first_pipeline_s",
)


@dataclass(frozen=True)
class Ratio:
    """graph / baseline of the medians, and what a hand-off costs in worker time."""

    steady: float
    total: float
    # (graph seconds per pipeline - baseline seconds per 3 tasks) / 2 hand-offs,
    # from the steady medians: throughput cost, not latency.
    steady_us_per_handoff: float


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {
        system: {metric: _stats([r[metric] for r in results]) for metric in METRICS}
        for system, results in runs.items()
    }
    graph, base = summary["graph"], summary["baseline"]
    steady_g = graph["steady_pipelines_per_s"]["median"]
    steady_b = base["steady_pipelines_per_s"]["median"]
    summary["ratio_graph_to_baseline"] = asdict(
        Ratio(
            steady=steady_g / steady_b,
            total=graph["total_pipelines_per_s"]["median"] / base["total_pipelines_per_s"]["median"],
            steady_us_per_handoff=(1 / steady_g - 1 / steady_b) / 2 * 1e6,
        )
    )
    return summary


def run_benchmark(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    n = args.pipelines
    report: dict[str, Any] = {
        "benchmark": "graph",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "batonq_version": batonq.__version__,
        "git_commit": git_commit(BENCH_DIR),
        "batonq_source": batonq_source(),
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "dsn")},
        "worker_command": " ".join(worker_command("DSN", args.concurrency)),
        "method": (
            "Per run and system: tables truncated, tasks enqueued in batches (untimed), VACUUM"
            " ANALYZE, one burst worker subprocess drains bench:a,bench:b,bench:c; polled every"
            f" {args.poll} s. graph: edges a->b->c, N roots in bench:a; baseline: no edges, N"
            " tasks in each queue. steady = tasks done after the first completion of any task /"
            " time from then to the last; total = 3N / (spawn to last done). pipelines/s ="
            " tasks/s / 3. Systems alternate their order run by run. Results checked after"
            " each run."
        ),
    }
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
    started = time.perf_counter()
    with scratch_database(args.dsn, keep=args.keep) as dsn, psycopg.connect(dsn, autocommit=True) as admin:
        report["database"] = conninfo_to_dict(dsn).get("dbname")
        report["postgres"] = postgres_info(admin)
        with batonq.connect(dsn, listen=False) as client:
            for run in range(args.runs):
                for system in SYSTEMS if run % 2 == 0 else SYSTEMS[::-1]:
                    began = time.perf_counter()
                    prepare(client, admin, system, n, args.batch)
                    prepared = time.perf_counter()
                    result = measure(dsn, admin, system, n, args)
                    measured = time.perf_counter()
                    verify(admin, system, n)
                    # Untimed set-up (truncate, enqueue, VACUUM) and check, for the wall-time budget.
                    result["prepare_s"] = prepared - began
                    result["verify_s"] = time.perf_counter() - measured
                    runs[system].append(result)
                    log(
                        f"run {run + 1}/{args.runs} {system:<8}"
                        f" {result['steady_tasks_per_s'] or 0:>8,.0f} tasks/s steady"
                        f" {result['total_tasks_per_s']:>8,.0f} tasks/s total"
                        f"  start-up {result['startup_s']:.2f} s  {result['seconds']:.2f} s, results OK"
                    )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    report["machine"]["loadavg_end"] = list(load) if load else None
    report["elapsed_s"] = time.perf_counter() - started
    report["runs"] = runs
    report["summary"] = summarise(runs)
    return report


def _cell(stats: dict[str, float] | None, fmt: str = ",.0f") -> str:
    if stats is None:
        return "-"
    return f"{stats['median']:{fmt}} [{stats['min']:{fmt}}-{stats['max']:{fmt}}]"


def format_table(report: dict[str, Any]) -> str:
    """A Markdown table: median [min-max] per system, and the ratio of the medians."""
    summary = report["summary"]
    n = report["args"]["pipelines"]
    labels = {
        "graph": f"graph a→b→c ({n:,} pipelines = {3 * n:,} tasks)",
        "baseline": f"baseline, no edges ({3 * n:,} independent tasks)",
    }
    lines = [
        "| system | pipelines/s steady | pipelines/s total | tasks/s steady | tasks/s total |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for system in SYSTEMS:
        s = summary[system]
        cells = " | ".join(_cell(s[m]) for m in METRICS[:4])
        lines.append(f"| {labels[system]} | {cells} |")
    ratio = summary["ratio_graph_to_baseline"]
    lines.append(
        f"| graph / baseline (medians) | {ratio['steady']:.2f} | {ratio['total']:.2f}"
        f" | {ratio['steady']:.2f} | {ratio['total']:.2f} |"
    )
    g, b = summary["graph"], summary["baseline"]
    lines += [
        "",
        f"{report['mode']}, {len(report['runs']['graph'])} run(s), -c {report['args']['concurrency']},"
        f" {report['elapsed_s']:.0f} s in all. steady = from the first completion of any task;"
        " baseline pipelines/s = tasks/s / 3.",
        f"Start-up (spawn -> first completion): graph {_cell(g['startup_s'], '.2f')} s,"
        f" baseline {_cell(b['startup_s'], '.2f')} s; first pipeline done after"
        f" {_cell(g['first_pipeline_s'], '.2f')} s. Hand-off cost (steady medians):"
        f" {ratio['steady_us_per_handoff']:,.0f} µs of worker time per hand-off.",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_graph.py",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dsn", default=DEFAULT_DSN,
        help="a server, by one of its databases, as a role that may create databases (default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="smoke: 1 run, 300 pipelines")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per system (default %(default)s)")
    parser.add_argument("--pipelines", type=int, default=10_000, help="N per run (default %(default)s)")
    parser.add_argument("-c", "--concurrency", type=int, default=200, help="worker -c (default %(default)s)")
    parser.add_argument("--batch", type=int, default=1_000, help="enqueue batch size (default %(default)s)")
    parser.add_argument("--poll", type=float, default=0.02, help="seconds between polls (default 0.02)")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds per run before giving up")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON results")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.pipelines = 1, 300
    if args.runs < 1 or args.pipelines < 1 or args.concurrency < 1 or args.batch < 1:
        parser.error("--runs, --pipelines, -c and --batch must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    report = run_benchmark(args, log=lambda line: print(line, file=sys.stderr, flush=True))
    report["command"] = " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"graph-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
