#!/usr/bin/env python3
"""Capacity figures for sizing: tasks per second of one ``batonq serve``
process (and of ``--workers 2``), and PostgreSQL CPU per task.

On a fresh private cluster (bench_sustained.py's: ``initdb`` in a temporary
directory, fsync on, nobody else's queries), with ``batonq serve`` on
loopback, HTTP clients claim and complete tasks until the queue is empty:

- ``b1``: ``POST /v1/claim`` of one task, then its ``POST /v1/submit``
  (what a plain HTTP worker does);
- ``b10`` / ``b100``: claims of 10 / 100 tasks, then one ``POST /v1/submit``
  with the batch as a list.

The same loops on the Python client straight to PostgreSQL (claim, then
``complete_many`` of the batch) are the baseline: the engine's own cost,
measured in the same run, so the HTTP figures read as ratios to it.

The load is ``--clients`` processes of ``--threads`` connections each,
started together. Each figure is the median of ``--runs`` runs with their
min-max; the set-ups alternate run by run. Per run:

- tasks/s over the wall clock;
- service CPU per task: user + system time of the ``batonq serve`` process
  tree (``/proc/<pid>/stat``);
- database CPU per task: the whole cluster's CPU time (backends, WAL
  writer, checkpointer, autovacuum) over the tasks done. The cluster serves
  only this benchmark, so the figure holds on a machine shared with other
  work; the throughput does not.

Both CPU figures are net of what the cluster and the service spend idle
(3 s before each run; the median of those windows is taken off).

    .venv/bin/python bench/bench_capacity.py             # 3 runs each, a few minutes
    .venv/bin/python bench/bench_capacity.py --quick     # a smoke run

Results go to ``bench/results/capacity-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from bench_http import http_worker, prepare, python_worker, served
from bench_sustained import cluster_cpu_s, private_cluster

import batonq
from batonq.benchmark import drive
from batonq.benchmark.environment import git_commit, machine_info, pressure, with_db

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SETUPS = (0, 1, 2)  # 0: the Python client straight to PostgreSQL; N: batonq serve --workers N
IDLE_S = 3.0


@dataclass(frozen=True, slots=True)
class Scenario:
    workers: int
    batch: int
    tasks: int

    @property
    def name(self) -> str:
        return f"{'python' if self.workers == 0 else f'serve{self.workers}'}_b{self.batch}"


def scenarios(quick: bool) -> list[Scenario]:
    sizes = {1: 300, 10: 1_000, 100: 4_000} if quick else {1: 1_000, 10: 5_000, 100: 20_000}
    return [Scenario(w, b, n) for b, n in sizes.items() for w in SETUPS]


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its descendants, live or reaped."""
    tick = os.sysconf("SC_CLK_TCK")
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(stat[i]) for i in (11, 12, 13, 14)) / tick  # utime stime cutime cstime
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(OSError):
            total += tree_cpu_s(int(child))
    return total


def client_process(where: str, key: str, threads: int, batch: int, start: Any, counts: Any) -> None:
    """``threads`` workers on one connection each: keep-alive HTTP to the
    URL ``where``, or the Python client on the DSN ``where`` (claim, then
    complete_many); the count they did goes to ``counts``."""
    if key:
        https = [
            httpx.Client(base_url=where, headers={"Authorization": f"Bearer {key}"}, timeout=60)
            for _ in range(threads)
        ]
        for http in https:  # open the connections untimed
            http.get("/v1/queues").raise_for_status()
        work = [http_worker(http, batch, each=batch == 1) for http in https]
        start.wait()
        counts.put(drive(work)[1])
        for http in https:
            http.close()
        return
    with batonq.connect(where, min_connections=threads, max_connections=threads, listen=False) as client:
        drive([lambda: len(client.claim("bench:warm-up")) for _ in range(threads)])  # connections open
        start.wait()
        counts.put(drive([python_worker(client, batch) for _ in range(threads)])[1])


def run_once(
    scenario: Scenario, args: argparse.Namespace, target: tuple[str, str, int | None], postmaster: int,
    admin: psycopg.Connection[Any], loader: batonq.Client,
) -> dict[str, float]:  # fmt: skip
    """One run: the raw figures, with the idle window measured just before."""
    where, key, serve_pid = target
    service_cpu_s = (lambda: tree_cpu_s(serve_pid)) if serve_pid else (lambda: 0.0)
    prepare(admin, loader, scenario.tasks)
    t0, db0, svc0 = time.perf_counter(), cluster_cpu_s(postmaster), service_cpu_s()
    time.sleep(IDLE_S)
    idle_s = time.perf_counter() - t0
    idle_db, idle_svc = (cluster_cpu_s(postmaster) - db0) / idle_s, (service_cpu_s() - svc0) / idle_s
    start = mp.Barrier(args.clients + 1)
    counts: Any = mp.Queue()
    procs = [
        mp.Process(target=client_process, args=(where, key, args.threads, scenario.batch, start, counts))
        for _ in range(args.clients)
    ]
    for proc in procs:
        proc.start()
    start.wait()
    t0, db0, svc0 = time.perf_counter(), cluster_cpu_s(postmaster), service_cpu_s()
    done = sum(counts.get(timeout=900) for _ in procs)
    t1, db1, svc1 = time.perf_counter(), cluster_cpu_s(postmaster), service_cpu_s()
    for proc in procs:
        proc.join(60)
    archived = admin.execute("SELECT count(*) FROM batonq.archive WHERE state = 'done'").fetchone()
    if done != scenario.tasks or archived != (scenario.tasks,):
        raise RuntimeError(f"{scenario.name}: {done} done by the clients, {archived} archived")
    return {"seconds": t1 - t0, "tasks": done, "db_cpu_s": db1 - db0, "service_cpu_s": svc1 - svc0,
            "db_idle_share": idle_db, "service_idle_share": idle_svc}  # fmt: skip


def per_task(runs: list[dict[str, float]], idle_db: float, idle_svc: float) -> dict[str, list[float]]:
    """Per run: tasks/s, and CPU µs per task net of the median idle rates."""
    return {
        "tasks_per_s": [r["tasks"] / r["seconds"] for r in runs],
        "db_cpu_us_per_task": [(r["db_cpu_s"] - idle_db * r["seconds"]) / r["tasks"] * 1e6 for r in runs],
        "service_cpu_us_per_task": [
            (r["service_cpu_s"] - idle_svc * r["seconds"]) / r["tasks"] * 1e6 for r in runs
        ],
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def table(plan: list[Scenario], results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        "| clients go to | batch | tasks/s | DB CPU µs/task | service CPU µs/task |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for s in plan:
        r = results[s.name]
        cells = [
            f"{r[f]['median']:,.0f} ({r[f]['min']:,.0f}-{r[f]['max']:,.0f})"
            for f in ("tasks_per_s", "db_cpu_us_per_task", "service_cpu_us_per_task")
        ]
        setup = "PostgreSQL (Python client)" if s.workers == 0 else f"batonq serve --workers {s.workers}"
        lines.append(f"| {setup} | {s.batch} | {cells[0]} | {cells[1]} | {cells[2] if s.workers else '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="timed runs per scenario (default 3)")
    parser.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--threads", type=int, default=4, help="connections per client process (default 4)")
    parser.add_argument("--quick", action="store_true", help="small runs, for a smoke test")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON results")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the service and the cluster
    runs = 1 if args.quick else args.runs
    plan = scenarios(args.quick)
    raw: dict[str, list[dict[str, float]]] = {s.name: [] for s in plan}
    about = machine_info()
    with private_cluster() as (server, postmaster):
        db = with_db(server, "capacity")
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute("CREATE DATABASE capacity")
        batonq.migrate(db)
        with (
            psycopg.connect(db, autocommit=True) as admin,
            batonq.connect(db, listen=False) as loader,
            contextlib.ExitStack() as stack,
        ):
            started = {w: stack.enter_context(served(db, "--workers", str(w))) for w in SETUPS if w}
            key = next(key for _, key, _ in started.values() if key)  # printed by the first only
            targets = {w: (url, key, pid) for w, (url, _, pid) in started.items()}
            targets[0] = (db, "", None)
            for s in plan:  # warm-up, untimed: a few claims on every connection
                warm = Scenario(s.workers, s.batch, s.batch * args.clients * args.threads * 4)
                run_once(warm, args, targets[s.workers], postmaster, admin, loader)
            for run in range(1, runs + 1):
                for s in plan:
                    figures = run_once(s, args, targets[s.workers], postmaster, admin, loader)
                    raw[s.name].append(figures)
                    print(f"run {run}/{runs} {s.name}: {figures['tasks'] / figures['seconds']:,.0f} tasks/s",
                          file=sys.stderr, flush=True)  # fmt: skip
    every = [r for runs_of in raw.values() for r in runs_of]
    idle_db = statistics.median(r["db_idle_share"] for r in every)
    idle_svc = {
        w: statistics.median(r["service_idle_share"] for s in plan if s.workers == w for r in raw[s.name])
        for w in SETUPS
    }
    values = {s.name: per_task(raw[s.name], idle_db, idle_svc[s.workers]) for s in plan}
    results = {name: {f: summary(v) for f, v in figures.items()} for name, figures in values.items()}
    report = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["bench/bench_capacity.py", *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_commit(),
        "machine": about,
        "pressure_after": pressure(),
        "loadavg_after": list(os.getloadavg()),
        "load": {"clients": args.clients, "threads": args.threads},
        "idle_cpu_share": {"database": idle_db, "service": idle_svc},
        "scenarios": [asdict(s) for s in plan],
        "results": results,
        "values": values,
        "raw": raw,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"capacity-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {path}", file=sys.stderr)
    print(f"load: {args.clients} processes x {args.threads} connections; {runs} runs: median (min-max)")
    print(f"load average {about['loadavg_start']} at the start, {list(os.getloadavg())} at the end")
    print(table(plan, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
