"""Core throughput of batonq against a hand-written raw psycopg loop.

Measures, on a scratch database it creates (``batonq_bench_<pid>``) next to
the one the DSN names, and drops again:

- enqueue: one task per call (1 and 8 connections), ``enqueue_many`` in
  batches of 100 and 10,000;
- claim + complete through the client: batch 1 (``complete``), 10 and 100
  (``complete_many``), with 1, 2 and 4 connections.

Every scenario also runs a BASELINE in the same database: a plain table with
one row per task, updated in place (single INSERT; INSERT ... SELECT unnest;
claim = UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n)
RETURNING, then an UPDATE marking the rows done), at the same batch size and
concurrency, so each batonq figure is also a ratio to it.

Each run starts from the same state: the tables are truncated, a claim
scenario's tasks are loaded untimed, then VACUUM ANALYZE. After an untimed
warm-up, batonq and the baseline alternate run by run (the machine may be
noisy), and each scenario reports the median and the min-max of its runs in
tasks per second.

Modules: ``targets`` (the two systems driven), ``environment`` (machine,
server, source, WAL and checkpoint readings, the scratch database), ``core``
(the scenarios, running them, the report). ``batonq bench`` and
``bench/bench_core.py`` are the entry points::

    report = run_benchmark("postgresql://postgres@localhost/postgres", quick=True)
    print(format_table(report))
    write_report(report, Path("."))
"""

from __future__ import annotations

from batonq.benchmark.core import (
    SCENARIOS,
    Run,
    Scenario,
    drive,
    format_table,
    run_benchmark,
    run_once,
    run_scenario,
    write_report,
)
from batonq.benchmark.environment import (
    batonq_source,
    git_commit,
    machine_info,
    postgres_info,
    scratch_database,
)
from batonq.benchmark.targets import Baseline, Batonq, Target

__all__ = [
    "SCENARIOS",
    "Baseline",
    "Batonq",
    "Run",
    "Scenario",
    "Target",
    "batonq_source",
    "drive",
    "format_table",
    "git_commit",
    "machine_info",
    "postgres_info",
    "run_benchmark",
    "run_once",
    "run_scenario",
    "scratch_database",
    "write_report",
]
