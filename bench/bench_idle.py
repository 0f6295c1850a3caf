#!/usr/bin/env python3
"""What an idle worker costs: CPU of a ``batonq worker`` process with
nothing to do, as a share of one core.

On a scratch database it starts ``batonq worker`` with the defaults a user
gets (``-c 10``, LISTEN/NOTIFY, the sweeper on), hands it one task to be sure
it is up, then reads the process's CPU time (``/proc/<pid>/stat``, so Linux
only) over ``--seconds`` of idling, and stops it.

    .venv/bin/python bench/bench_idle.py [--seconds 60]

Results go to ``bench/results/idle-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import batonq
from batonq.benchmark.environment import machine_info, scratch_database

BENCH = Path(__file__).resolve().parent
DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
QUEUE = "bench:workers"  # the queue of bench/peers/batonq_noop.py


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until_done(dsn: str, task_id: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with batonq.connect(dsn, listen=False) as client:
        while client.task(task_id).state != "done":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not run a task within {timeout:g} s")
            time.sleep(0.05)


def measure(dsn: str, seconds: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{BENCH / 'peers'}:{os.environ.get('PYTHONPATH', '')}"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "batonq", "--dsn", dsn, "worker", "batonq_noop:app", "--queues", QUEUE,
         "--log-level", "warning"],
        env=env,
    )  # fmt: skip
    try:
        with batonq.connect(dsn, listen=False) as client:
            task = client.enqueue(QUEUE, {"warm-up": True})
        wait_until_done(dsn, task.task_id, timeout=60)
        time.sleep(1)  # let the job's own work settle
        start_cpu, start = cpu_seconds(worker.pid), time.monotonic()
        time.sleep(seconds)
        used, elapsed = cpu_seconds(worker.pid) - start_cpu, time.monotonic() - start
    finally:
        worker.terminate()
        worker.wait(30)
    return {"seconds": elapsed, "cpu_seconds": used, "core_percent": 100 * used / elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a server's maintenance database")
    parser.add_argument("--seconds", type=float, default=60.0, help="idle time measured (default 60)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    if not Path(f"/proc/{os.getpid()}/stat").exists():
        parser.error("needs /proc (Linux) to read the worker's CPU time")
    with scratch_database(args.dsn) as dsn:
        result = measure(dsn, args.seconds)
    print(f"idle worker: {result['cpu_seconds']:.2f} s of CPU in {result['seconds']:.0f} s"
          f" = {result['core_percent']:.2f}% of a core")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.out / f"idle-{stamp}.json"
    path.write_text(json.dumps({**result, "machine": machine_info()}, indent=2))
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
