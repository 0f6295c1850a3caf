#!/usr/bin/env python3
"""HTTP claim+submit throughput of ``batonq serve``, next to the Python client's.

On a scratch database it creates (``batonq_bench_http_<pid>``) and drops
again, with one ``batonq serve`` process on loopback, it measures tasks per
second claimed and completed:

- ``python``: the synchronous client, ``claim(max_tasks=B)`` then
  ``complete_many`` of the batch (one round trip each), one pooled
  connection per thread -- the same loop as bench_core.py's;
- ``http``: per thread one keep-alive ``httpx.Client``: ``POST /v1/claim``
  with ``max_tasks=B``, then one ``POST /v1/submit`` with the batch as a list;
- ``http-each``: the same claims, then one ``POST /v1/submit`` per task (what
  a client that does not batch its submits gets).

at batch sizes 10 and 100, with 2 and 4 threads. Every run starts from the same
state (tables truncated, the tasks loaded untimed, VACUUM ANALYZE); the
targets alternate run by run, and each figure is the median of the runs with
their min-max. Results go to ``bench/results/http-<timestamp>.json``
(``--out`` another directory) and a table (Markdown with ``--markdown``) is
printed.

Usage::

    .venv/bin/python bench/bench_http.py                # full: 3 runs each, a few minutes
    .venv/bin/python bench/bench_http.py --quick        # smoke, < 1 minute
    .venv/bin/python bench/bench_http.py --dsn postgresql://postgres@db:5432/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import batonq
from batonq.benchmark import drive  # bench_core.py's thread driver, so figures compare

DEFAULT_DSN = os.environ.get("BATONQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUEUE = "bench:http"
RESULT: dict[str, Any] = {"ok": True}
TABLES = "batonq.tasks, batonq.archive, batonq.submits, batonq.idempotency_keys"
TARGETS = ("python", "http", "http-each")
ADMIN_KEY = re.compile(r"\bbq_[0-9]+_[0-9a-f]{64}\b")


@dataclass(frozen=True, slots=True)
class Scenario:
    target: str
    batch: int
    threads: int
    tasks: int

    @property
    def name(self) -> str:
        return f"{self.target}_b{self.batch}_t{self.threads}"


def scenarios(quick: bool) -> list[Scenario]:
    found = []
    for batch in (10, 100):
        for threads in (2, 4):
            for target in TARGETS:
                if target == "http-each" and threads != 4:
                    continue  # one figure is enough to show what batching the submits buys
                if quick:
                    tasks = 400 if target != "python" else 1_000
                else:
                    tasks = {"python": 20_000, "http": 10_000, "http-each": 2_000}[target]
                unit = batch * threads
                found.append(Scenario(target, batch, threads, max(unit, tasks // unit * unit)))
    return found


# --------------------------------------------------------------------------
# The server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def served(dsn: str, *options: str) -> Iterator[tuple[str, str | None, int]]:
    """A ``batonq serve`` process on ``dsn`` (with more ``options``); yields its
    URL, the admin key it printed (None if the database had keys) and its pid."""
    port = _free_port()
    batonq_cli = Path(sys.executable).with_name("batonq")
    proc = subprocess.Popen(
        [str(batonq_cli), "--dsn", dsn, "serve", "--port", str(port), "--log-level", "warning", *options],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # --workers N on a busy machine: tens of seconds
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("batonq serve did not start:\n" + "".join(lines))
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        found = ADMIN_KEY.search("".join(lines))
        yield url, found.group(0) if found else None, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        proc.stderr.close()


# --------------------------------------------------------------------------
# The loops


def python_worker(client: batonq.Client, batch: int) -> Callable[[], int]:
    def work() -> int:
        total = 0
        while leases := client.claim(QUEUE, max_tasks=batch):
            replies = client.complete_many([(lease.lease_token, RESULT) for lease in leases])
            if not all(reply.outcome == "accepted" for reply in replies):
                raise RuntimeError(f"a completion was refused: {replies}")
            total += len(leases)
        return total

    return work


def http_worker(http: httpx.Client, batch: int, each: bool) -> Callable[[], int]:
    def work() -> int:
        total = 0
        while True:
            claimed = http.post("/v1/claim", json={"queue": QUEUE, "max_tasks": batch})
            claimed.raise_for_status()
            body = claimed.json()
            # A one-task claim answers the task itself (task_id null: none).
            tasks = body["tasks"] if batch > 1 else [body] if body["task_id"] is not None else []
            if not tasks:
                return total
            if each:
                for task in tasks:
                    done = http.post(
                        "/v1/submit", json={"lease_token": task["lease_token"], "result": RESULT}
                    )
                    done.raise_for_status()
            else:
                items = [{"lease_token": task["lease_token"], "result": RESULT} for task in tasks]
                done = http.post("/v1/submit", json=items)
                done.raise_for_status()
                if not all(r["outcome"] == "accepted" for r in done.json()["results"]):
                    raise RuntimeError(f"a completion was refused: {done.text}")
            total += len(tasks)

    return work


def prepare(admin: psycopg.Connection[Any], loader: batonq.Client, tasks: int) -> None:
    admin.execute(f"TRUNCATE {TABLES}")
    for start in range(0, tasks, 10_000):
        loader.enqueue_many(QUEUE, [{"n": n} for n in range(start, min(tasks, start + 10_000))])
    admin.execute("VACUUM (ANALYZE) batonq.tasks")
    admin.execute("VACUUM (ANALYZE) batonq.archive")


def run_once(
    scenario: Scenario, admin: psycopg.Connection[Any], loader: batonq.Client, db: str, url: str, key: str
) -> float:
    prepare(admin, loader, scenario.tasks)
    if scenario.target == "python":
        with batonq.connect(
            db, min_connections=scenario.threads, max_connections=scenario.threads, listen=False
        ) as client:
            # Warm the pool's connections (and their prepared statements) untimed.
            drive([lambda: len(client.claim("bench:warm-up")) for _ in range(scenario.threads)])
            seconds, done = drive([python_worker(client, scenario.batch) for _ in range(scenario.threads)])
    else:
        clients = [
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
            for _ in range(scenario.threads)
        ]
        try:
            for http in clients:  # open the keep-alive connections untimed
                http.get("/v1/queues").raise_for_status()
            each = scenario.target == "http-each"
            seconds, done = drive([http_worker(http, scenario.batch, each) for http in clients])
        finally:
            for http in clients:
                http.close()
    row = admin.execute("SELECT count(*) FROM batonq.archive WHERE state = 'done'").fetchone()
    if done != scenario.tasks or row is None or row[0] != scenario.tasks:
        raise RuntimeError(
            f"{scenario.name}: {done} done by the loops, {row} in the archive, of {scenario.tasks}"
        )
    return done / seconds


# --------------------------------------------------------------------------


def _with_db(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def machine(admin: psycopg.Connection[Any]) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    row = admin.execute("SHOW server_version").fetchone()
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "postgresql": row[0] if row else "?",
        "os": platform.platform(),
    }


def summarise(rates: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        name: {"median": statistics.median(r), "min": min(r), "max": max(r), "runs": len(r)}
        for name, r in rates.items()
    }


def table(plan: list[Scenario], summary: dict[str, dict[str, float]], markdown: bool) -> str:
    lines = [
        "| batch | threads | target | tasks/s (median) | min-max | vs python |",
        "| ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for s in plan:
        figure = summary[s.name]
        python = summary[Scenario("python", s.batch, s.threads, 0).name]
        ratio = figure["median"] / python["median"]
        lines.append(
            f"| {s.batch} | {s.threads} | {s.target} | {figure['median']:,.0f} "
            f"| {figure['min']:,.0f}-{figure['max']:,.0f} | {ratio:.2f} |"
        )
    text = "\n".join(lines)
    return text if markdown else text.replace("|", " ").replace(" ---: ", "      ").replace(" --- ", "     ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a server, by one of its databases")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per scenario (default 3)")
    parser.add_argument("--quick", action="store_true", help="small runs, for a smoke test")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for http-<timestamp>.json")
    parser.add_argument("--no-save", action="store_true", help="do not write the JSON results")
    args = parser.parse_args(argv)

    runs = 1 if args.quick else args.runs
    plan = scenarios(args.quick)
    name = f"batonq_bench_http_{os.getpid()}"
    db = _with_db(args.dsn, name)
    with psycopg.connect(args.dsn, autocommit=True) as server:
        server.execute(f'DROP DATABASE IF EXISTS "{name}"')
        server.execute(f'CREATE DATABASE "{name}"')
    try:
        batonq.migrate(db)
        with (
            psycopg.connect(db, autocommit=True) as admin,
            batonq.connect(db, listen=False) as loader,
            served(db) as (url, admin_key, _),
        ):
            assert admin_key, "a new database: batonq serve prints an admin key"
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}) as http:
                made = http.post("/v1/keys", json={"ring": 2, "queues": ["bench:*"], "name": "bench"})
                made.raise_for_status()
                key = made.json()["key"]
            about = machine(admin)
            rates: dict[str, list[float]] = {s.name: [] for s in plan}
            # Untimed warm-up of every scenario, then the runs, alternating targets.
            for s in plan:
                run_once(
                    Scenario(s.target, s.batch, s.threads, s.batch * s.threads * 2),
                    admin,
                    loader,
                    db,
                    url,
                    key,
                )
            for run in range(runs):
                for s in plan:
                    rate = run_once(s, admin, loader, db, url, key)
                    rates[s.name].append(rate)
                    print(f"run {run + 1}/{runs} {s.name}: {rate:,.0f} tasks/s", file=sys.stderr, flush=True)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as server:
            server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    summary = summarise(rates)
    command = "python bench/bench_http.py" + ("" if argv is None else " " + " ".join(argv or []))
    report = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if argv is None else command,
        "machine": about,
        "scenarios": [asdict(s) for s in plan],
        "results": summary,
        "rates": rates,
    }
    if not args.no_save:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"http-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"results: {path}", file=sys.stderr)
    print(f"{about['cpu']}, {about['cpus']} CPUs, PostgreSQL {about['postgresql']}, Python {about['python']}")
    print(table(plan, summary, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
