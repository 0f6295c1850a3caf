"""Enqueue -> handler-start latency at a steady rate: batonq's worker runtime
(a real `batonq worker` process, woken by LISTEN/NOTIFY) against a raw
LISTEN/NOTIFY loop (INSERT + NOTIFY in one transaction; the listener claims the
row with DELETE ... RETURNING), measured in the same run on a scratch database.

    .venv/bin/python bench/bench_latency.py [--rate 100] [--seconds 10] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

import batonq

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def with_db(dsn: str, name: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = name
    return make_conninfo(**params)


def paced(rate: float, seconds: float, send: object) -> int:
    """Call ``send()`` ``rate`` times a second for ``seconds``; returns how many."""
    assert callable(send)
    interval, start, n = 1.0 / rate, time.monotonic(), int(rate * seconds)
    for i in range(n):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        send()
    return n


def wait_for_lines(path: Path, n: int, timeout: float) -> list[float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().split()
        if len(lines) >= n:
            return [float(x) for x in lines[:n]]
        time.sleep(0.05)
    raise RuntimeError(f"only {len(path.read_text().split())} of {n} samples arrived")


def run_batonq(dsn: str, rate: float, seconds: float) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "latency.txt"
        out.touch()
        env = {**os.environ, "BATONQ_BENCH_LATENCY_FILE": str(out),
               "PYTHONPATH": f"{ROOT / 'bench' / 'handlers'}:{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
        worker = subprocess.Popen(
            [sys.executable, "-m", "batonq", "--dsn", dsn, "worker", "latency_app:app", "-c", "50",
             "--no-sweeper", "--log-level", "warning", "--wait", "30"],
            env=env,
        )  # fmt: skip
        try:
            with batonq.connect(dsn) as client:
                client.enqueue("latency", {"sent": time.time()})  # warm the worker up
                wait_for_lines(out, 1, 30)
                out.write_text("")
                n = paced(rate, seconds, lambda: client.enqueue("latency", {"sent": time.time()}))
            return wait_for_lines(out, n, 30)
        finally:
            worker.terminate()
            worker.wait(30)


def run_raw(dsn: str, rate: float, seconds: float) -> list[float]:
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE IF NOT EXISTS raw_jobs (id bigserial PRIMARY KEY, payload jsonb)")
        setup.execute("TRUNCATE raw_jobs")
    samples: list[float] = []
    ready, stop = threading.Event(), threading.Event()

    def listen() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("LISTEN raw_jobs")
            ready.set()
            while not stop.is_set():
                if not select.select([conn.fileno()], [], [], 0.2)[0]:
                    continue
                for _ in conn.notifies(timeout=0, stop_after=1000):
                    pass
                rows = conn.execute(
                    "DELETE FROM raw_jobs WHERE id IN (SELECT id FROM raw_jobs ORDER BY id"
                    " FOR UPDATE SKIP LOCKED LIMIT 100) RETURNING payload"
                ).fetchall()
                now = time.time()
                samples.extend(now - p["sent"] for (p,) in rows)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    ready.wait(10)
    with psycopg.connect(dsn, autocommit=True) as conn:

        def send() -> None:
            with conn.transaction():
                conn.execute("INSERT INTO raw_jobs (payload) VALUES (%s)", (Jsonb({"sent": time.time()}),))
                conn.execute("NOTIFY raw_jobs")

        n = paced(rate, seconds, send)
    deadline = time.monotonic() + 30
    while len(samples) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(5)
    return samples[:n]


def summary(samples: list[float]) -> dict[str, Any]:
    """p50 and p99 in ms, and every sample (ms, to the microsecond) for the
    distribution plot."""
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "samples_ms": [round(1000 * s, 3) for s in samples],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a server's maintenance database")
    parser.add_argument("--rate", type=float, default=100.0, help="tasks per second (default 100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per run (default 10)")
    parser.add_argument("--runs", type=int, default=3, help="runs per system (default 3)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    name = f"batonq_latency_{os.getpid()}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = with_db(args.dsn, name)
    results: dict[str, list[dict[str, Any]]] = {"batonq": [], "raw": []}
    try:
        batonq.migrate(dsn)
        for run in range(args.runs):
            for system, measure in (("raw", run_raw), ("batonq", run_batonq)):
                got = summary(measure(dsn, args.rate, args.seconds))
                results[system].append(got)
                p50, p99, n = got["p50_ms"], got["p99_ms"], got["n"]
                print(f"run {run + 1} {system}: p50 {p50:.2f} ms, p99 {p99:.2f} ms (n={n:.0f})")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    for key in ("p50_ms", "p99_ms"):
        b = statistics.median(r[key] for r in results["batonq"])
        r = statistics.median(x[key] for x in results["raw"])
        print(f"{key}: batonq {b:.2f} ms, raw {r:.2f} ms, ratio {b / r:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    (args.out / f"latency-{stamp}.json").write_text(
        json.dumps({"rate": args.rate, "seconds": args.seconds, **results}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
