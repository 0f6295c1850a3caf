#!/usr/bin/env python3
"""The fault battery's long run, by hand: a million tasks through worker
processes with retention on, on a private PostgreSQL cluster (fsync on) that
this script starts and removes, optionally with a worker SIGKILLed every few
seconds.

It checks what only a long run shows:

- claim latency at the end within 2x of the start (a probe claims one task
  of its own queue every few seconds while the backlog churns);
- the hot table near empty once the run is drained (finished tasks moved to
  the archive; the hot table's size on disk stays bounded);
- retention working: finished tasks older than the queue's ``retention_s``
  deleted while the run goes on, and archive day partitions older than the
  longest retention dropped by the sweeper's maintenance.

    .venv/bin/python bench/soak.py [--tasks 1000000] [--workers 4] [--slots 50]
                                   [--retention-s 120] [--kill-every 0] [--autovacuum on]

Prints one JSON report and writes it to ``bench/results/soak-<timestamp>.json``.
Exit status 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.battery import A, B, Database, Fleet  # noqa: E402
from tests.chaos.cluster import private_cluster  # noqa: E402

import batonq  # noqa: E402

PROBE = "soak:probe"


def probe(db: Database, stop: threading.Event, every_s: float, samples: list[tuple[float, float]]) -> None:
    """Every ``every_s``: enqueue one task on the probe queue and time its claim."""
    with batonq.connect(db.dsn, max_connections=1, listen=False) as client:
        while not stop.wait(every_s):
            client.enqueue(PROBE, None)
            began = time.perf_counter()
            leases = client.claim(PROBE)
            samples.append((time.monotonic(), time.perf_counter() - began))
            for lease in leases:
                client.complete(lease.lease_token, None)


def feed(db: Database, tasks: int, backlog: int, fed: list[int]) -> None:
    """Enqueue ``tasks`` in batches of 1,000, keeping about ``backlog`` unfinished."""
    with batonq.connect(db.dsn, max_connections=1, listen=False) as client:
        while fed[0] < tasks:
            if db.unfinished() > backlog:
                time.sleep(0.2)
                continue
            batch = min(1000, tasks - fed[0])
            client.enqueue_many(B, [{"n": fed[0] + i} for i in range(batch)])
            fed[0] += batch


def hot_table(db: Database) -> dict[str, int]:
    rows, size = db.sql(
        """SELECT (SELECT count(*) FROM batonq.tasks),
                  (SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits
                    WHERE inhparent = 'batonq.tasks'::regclass)"""
    )[0]
    return {"rows": int(rows), "bytes": int(size)}


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with private_cluster(autovacuum=args.autovacuum == "on") as cluster:
        db = Database(cluster)
        with batonq.connect(db.owner_dsn) as admin:
            # Every queue's: day partitions go once older than the longest retention.
            for queue in (A, B, PROBE):
                admin.configure_queue(queue, retention_s=args.retention_s)
        fleet = Fleet(db, workdir, args.workers, slots=args.slots, lease_s=5, env={"CHAOS_WORK_S": "0"})
        samples: list[tuple[float, float]] = []
        fed = [0]
        stop = threading.Event()
        threads = [threading.Thread(target=probe, args=(db, stop, args.probe_every_s, samples)),
                   threading.Thread(target=feed, args=(db, args.tasks, args.backlog, fed))]  # fmt: skip
        started = time.monotonic()
        for thread in threads:
            thread.start()
        progress: list[dict[str, Any]] = []
        last_kill = started
        try:
            while fed[0] < args.tasks or db.unfinished():
                time.sleep(1)
                now = time.monotonic()
                if args.kill_every and now - last_kill >= args.kill_every:
                    fleet.kill_one()
                    last_kill = now
                if not progress or now - started - progress[-1]["t"] >= 60:
                    done = db.sql("SELECT count(*) FROM batonq.archive WHERE queue = %s", (B,))[0][0]
                    line = {
                        "t": round(now - started),
                        "fed": fed[0],
                        "archived_now": int(done),
                        "hot": hot_table(db),
                    }
                    progress.append(line)
                    print(json.dumps(line), flush=True)
            ended = time.monotonic()
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
            fleet.stop()
        maintained = db.sql("SELECT batonq.maintain()")[0][0]
        partitions = [name for (name,) in db.sql(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'batonq.archive'::regclass ORDER BY 1")]  # fmt: skip
        archived = int(db.sql("SELECT count(*) FROM batonq.archive WHERE queue = %s", (B,))[0][0])
        dead_rows = int(db.sql("SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables"
                               " WHERE relname LIKE 'tasks_p%%'")[0][0])  # fmt: skip
        hot = hot_table(db)
    minute = max(1, len(samples) // 10)
    first = statistics.median(s for _, s in samples[:minute]) if samples else 0.0
    last = statistics.median(s for _, s in samples[-minute:]) if samples else 0.0
    return {
        "tasks": args.tasks, "workers": args.workers, "slots": args.slots, "kills": fleet.kills,
        "autovacuum": args.autovacuum, "retention_s": args.retention_s,
        "run_s": round(ended - started, 1), "tasks_per_s": round(args.tasks / (ended - started)),
        "claim_ms_first_tenth": round(1000 * first, 2), "claim_ms_last_tenth": round(1000 * last, 2),
        "hot_table_at_end": hot, "hot_dead_rows_at_end": dead_rows,
        "archived_rows_kept": archived, "retention_removed_rows": args.tasks - archived,
        "archive_partitions": partitions, "last_maintain": maintained, "progress": progress,
        "checks": {
            "claim latency at the end within 2x of the start": last <= 2 * max(first, 0.001),
            "hot table empty": hot["rows"] == 0,
            "retention removed finished tasks": archived < args.tasks,
        },
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=20_000, help="unfinished tasks to keep queued")
    parser.add_argument("--retention-s", type=int, default=120)
    parser.add_argument("--kill-every", type=float, default=0, help="SIGKILL a random worker every N s")
    parser.add_argument("--probe-every-s", type=float, default=2.0)
    parser.add_argument("--autovacuum", choices=["on", "off"], default="on")
    args = parser.parse_args()
    random.seed(20261203)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with tempfile.TemporaryDirectory(prefix="batonq-soak-") as workdir:  # worker logs and histories
        result = run(args, Path(workdir))
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "results" / f"soak-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
