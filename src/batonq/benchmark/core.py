"""The core scenarios and how they run: enqueue, and claim + complete, each
against batonq and the baseline; the report, its table and its JSON file."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

import batonq
from batonq.benchmark.environment import (
    batonq_source,
    checkpoints,
    git_commit,
    machine_info,
    postgres_info,
    pressure,
    scratch_database,
    wal_bytes,
    wal_lsn,
)
from batonq.benchmark.targets import Baseline, Batonq, Op, Target, make_payloads

__all__ = [
    "SCENARIOS",
    "Run",
    "Scenario",
    "drive",
    "format_table",
    "run_benchmark",
    "run_once",
    "run_scenario",
    "write_report",
]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One measured workload: ``tasks`` per timed run (full mode)."""

    op: Op
    batch: int
    connections: int
    tasks: int
    quick_tasks: int

    @property
    def name(self) -> str:
        """``enqueue_b100_c1``: what ``--only`` and the results call it."""
        return f"{self.op}_b{self.batch}_c{self.connections}"

    def size(self, quick: bool, scale: float) -> int:
        if quick:
            return self.quick_tasks
        # Whole batches for every connection, at least one each.
        unit = self.batch * self.connections
        return max(unit, round(self.tasks * scale / unit) * unit)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("enqueue", 1, 1, 2_000, 200),
    Scenario("enqueue", 1, 8, 4_000, 400),
    Scenario("enqueue", 100, 1, 50_000, 500),
    Scenario("enqueue", 10_000, 1, 100_000, 10_000),
    Scenario("claim_complete", 1, 1, 1_500, 200),
    Scenario("claim_complete", 1, 2, 2_000, 200),
    Scenario("claim_complete", 1, 4, 2_500, 200),
    Scenario("claim_complete", 10, 1, 8_000, 300),
    Scenario("claim_complete", 10, 2, 10_000, 300),
    Scenario("claim_complete", 10, 4, 10_000, 400),
    Scenario("claim_complete", 100, 1, 30_000, 500),
    Scenario("claim_complete", 100, 2, 40_000, 600),
    Scenario("claim_complete", 100, 4, 40_000, 800),
)


def drive(work: Sequence[Callable[[], int]]) -> tuple[float, int]:
    """Run each callable in its own thread, started together; (seconds, tasks)."""
    barrier = threading.Barrier(len(work) + 1)
    counts = [0] * len(work)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            counts[i] = work[i]()
        except BaseException as error:  # re-raised in the main thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=body, args=(i,), name=f"bench-{i}") for i in range(len(work))]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed, sum(counts)


def _enqueue_work(target: Target, slot: int, payloads: list[dict[str, Any]], batch: int) -> Callable[[], int]:
    chunks = [payloads[i : i + batch] for i in range(0, len(payloads), batch)]

    def work() -> int:
        return sum(target.enqueue(slot, chunk) for chunk in chunks)

    return work


def _claim_work(target: Target, slot: int, batch: int) -> Callable[[], int]:
    def work() -> int:
        total = 0
        while got := target.claim_complete(slot, batch):
            total += got
        return total

    return work


@dataclass(frozen=True, slots=True)
class Run:
    seconds: float
    tasks: int
    wal_bytes: int
    checkpoints: int

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.seconds


def run_once(target: Target, admin: psycopg.Connection[Any], scenario: Scenario, n: int) -> Run:
    """One timed run of ``scenario`` over ``n`` tasks, from a clean state."""
    target.reset(admin)
    if scenario.op == "claim_complete":
        target.preload(admin, n)
    target.vacuum(admin)
    conns = scenario.connections
    if scenario.op == "enqueue":
        shares = [n // conns + (1 if slot < n % conns else 0) for slot in range(conns)]
        work = [
            _enqueue_work(target, slot, make_payloads(sum(shares[:slot]), shares[slot]), scenario.batch)
            for slot in range(conns)
        ]
    else:
        work = [_claim_work(target, slot, scenario.batch) for slot in range(conns)]
    lsn, ckpts = wal_lsn(admin), checkpoints(admin)
    seconds, done = drive(work)
    wal = wal_bytes(admin, lsn, wal_lsn(admin))
    ckpts = checkpoints(admin) - ckpts
    counted = target.count(admin, scenario.op)
    if done != n or counted != n:
        raise RuntimeError(
            f"{target.label} {scenario.name}: expected {n} tasks, drove {done}, found {counted}"
        )
    return Run(seconds, n, wal, ckpts)


def _summary(runs: Sequence[Run]) -> dict[str, Any]:
    rates = [r.tasks_per_s for r in runs]
    return {
        "median_tasks_per_s": statistics.median(rates),
        "min_tasks_per_s": min(rates),
        "max_tasks_per_s": max(rates),
        "runs_tasks_per_s": rates,
        "runs_seconds": [r.seconds for r in runs],
        # WAL is counted server-wide: other databases' writes only add to it,
        # so the least of the runs is the closest to this workload's own.
        "wal_bytes_per_task": min(r.wal_bytes / r.tasks for r in runs),
        "checkpoints_during_runs": [r.checkpoints for r in runs],
    }


def run_scenario(
    scenario: Scenario,
    targets: Sequence[Target],
    admin: psycopg.Connection[Any],
    *,
    n: int,
    warmup: int,
    runs: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Warm up every target, then alternate their runs; returns the summary."""
    results: dict[str, list[Run]] = {t.label: [] for t in targets}
    for target in targets:
        target.open(scenario.connections)
    try:
        if warmup:
            for target in targets:
                run_once(target, admin, scenario, warmup)
        for i in range(runs):
            order = targets if i % 2 == 0 else list(reversed(targets))
            for target in order:
                run = run_once(target, admin, scenario, n)
                results[target.label].append(run)
                log(f"  {scenario.name} run {i + 1}/{runs} {target.label}: {run.tasks_per_s:,.0f} tasks/s")
    finally:
        for target in targets:
            target.close()
    summary: dict[str, Any] = {
        "name": scenario.name,
        "op": scenario.op,
        "batch": scenario.batch,
        "connections": scenario.connections,
        "tasks_per_run": n,
        "warmup_tasks": warmup,
        "runs": runs,
    }
    for label, label_runs in results.items():
        summary[label] = _summary(label_runs)
    if "batonq" in results and "baseline" in results:
        summary["ratio"] = summary["batonq"]["median_tasks_per_s"] / summary["baseline"]["median_tasks_per_s"]
        paired = [
            a.tasks_per_s / b.tasks_per_s for a, b in zip(results["batonq"], results["baseline"], strict=True)
        ]
        summary["ratio_runs"] = paired
    return summary


def run_benchmark(
    dsn: str,
    *,
    quick: bool = False,
    runs: int | None = None,
    scale: float = 1.0,
    only: Sequence[str] | None = None,
    keep_db: bool = False,
    log: Callable[[str], None] = print,
    run_log: Callable[[str], None] | None = None,
    git_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the scenarios (all, or ``only`` these names); returns the report.

    ``dsn`` names the server by one of its databases, as a role that may
    create databases; the scenarios run in a scratch database next to it.
    ``log`` gets a line per scenario, ``run_log`` (default: ``log``) one per
    timed run; ``git_dir`` is where to read the ``git_commit`` from (default:
    this package's directory).
    """
    runs = runs if runs is not None else (1 if quick else 3)
    scenarios = [s for s in SCENARIOS if not only or s.name in only]
    unknown = set(only or ()) - {s.name for s in SCENARIOS}
    if unknown:
        raise ValueError(f"unknown scenarios: {', '.join(sorted(unknown))}")
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "core",
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "quick" if quick else "full",
        "runs": runs,
        "scale": scale,
        "batonq_version": batonq.__version__,
        "git_commit": git_commit(git_dir),
        "batonq_source": batonq_source(),
        "machine": machine_info(),
        "method": (
            "Each run: truncate, load a claim scenario's tasks untimed, VACUUM ANALYZE, then time"
            " the threads (one per connection) from a common start until all finish. batonq uses"
            " one batonq.Client (pool size = connections); the baseline one psycopg connection per"
            " thread, autocommit, its claim unprepared. Warm-up run first; batonq and baseline"
            " alternate runs."
            " ratio = batonq median / baseline median (tasks/s)."
        ),
        "scenarios": [],
    }
    with scratch_database(dsn, keep=keep_db) as db, psycopg.connect(db, autocommit=True) as admin:
        report["database"] = conninfo_to_dict(db).get("dbname")
        report["postgres"] = postgres_info(admin)
        targets: list[Target] = [Batonq(db), Baseline(db)]
        for scenario in scenarios:
            n = scenario.size(quick, scale)
            unit = scenario.batch * scenario.connections
            warmup = 0 if quick else max(unit, n // 5)
            log(f"{scenario.name}: {n:,} tasks x {runs} run{'' if runs == 1 else 's'} (warm-up {warmup:,})")
            report["scenarios"].append(
                run_scenario(scenario, targets, admin, n=n, warmup=warmup, runs=runs, log=run_log or log)
            )
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    report["machine"]["loadavg_end"] = list(load) if load else None
    report["machine"]["pressure_end"] = pressure()
    report["elapsed_s"] = time.perf_counter() - started
    return report


def _fmt_rate(summary: dict[str, Any]) -> str:
    return (
        f"{summary['median_tasks_per_s']:>9,.0f}"
        f" ({summary['min_tasks_per_s']:,.0f}-{summary['max_tasks_per_s']:,.0f})"
    )


def format_table(report: dict[str, Any]) -> str:
    """The report as a plain-text table: medians, min-max, ratio."""
    head = (
        f"{'scenario':<24} {'batonq tasks/s (min-max)':>28} {'baseline tasks/s (min-max)':>30}"
        f" {'ratio':>6} {'WAL B/task':>12} {'ckpts':>7}"
    )
    lines = [head, "-" * len(head)]
    for s in report["scenarios"]:
        wal = f"{s['batonq']['wal_bytes_per_task']:,.0f}/{s['baseline']['wal_bytes_per_task']:,.0f}"
        ckpts = (
            f"{sum(s['batonq']['checkpoints_during_runs'])}/{sum(s['baseline']['checkpoints_during_runs'])}"
        )
        lines.append(
            f"{s['name']:<24} {_fmt_rate(s['batonq']):>28} {_fmt_rate(s['baseline']):>30}"
            f" {s['ratio']:>6.2f} {wal:>12} {ckpts:>7}"
        )
    lines.append(
        f"mode {report['mode']}, {report['runs']} run(s) per scenario, {report['elapsed_s']:.0f} s;"
        " ratio = batonq / baseline; WAL bytes per task (least of the runs, server-wide) and"
        " checkpoints during the timed runs, batonq/baseline"
    )
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: Path) -> Path:
    """Write ``report`` to ``out_dir/core-<UTC timestamp>.json``; returns the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"core-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path
