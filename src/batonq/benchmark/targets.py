"""The two systems the core benchmark drives: batonq through its synchronous
client, and a hand-written psycopg loop on a plain table (the baseline)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

import batonq

__all__ = [
    "BASELINE_SCHEMA",
    "QUEUE",
    "RESULT",
    "Baseline",
    "Batonq",
    "Op",
    "Target",
    "make_payloads",
]

QUEUE = "bench:core"
RESULT: dict[str, Any] = {"ok": True}

Op = Literal["enqueue", "claim_complete"]


def make_payloads(start: int, n: int) -> list[dict[str, Any]]:
    """``n`` small task payloads, numbered from ``start``."""
    return [{"n": i, "kind": "bench"} for i in range(start, start + n)]


class Target(ABC):
    """A task queue the benchmark can drive: batonq, or the raw baseline."""

    label: str
    tables: tuple[str, ...]

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    @abstractmethod
    def open(self, connections: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def enqueue(self, slot: int, payloads: list[dict[str, Any]]) -> int:
        """Enqueue ``payloads`` in one call (one task: the single-task call)."""

    @abstractmethod
    def claim_complete(self, slot: int, batch: int) -> int:
        """Claim up to ``batch`` tasks, complete them; 0 when none were left."""

    @abstractmethod
    def preload(self, admin: psycopg.Connection[Any], n: int) -> None:
        """Make ``n`` claimable tasks (untimed)."""

    @abstractmethod
    def count(self, admin: psycopg.Connection[Any], op: Op) -> int:
        """How many tasks a run of ``op`` left enqueued, or completed."""

    def reset(self, admin: psycopg.Connection[Any]) -> None:
        """Empty the tables: truncate just the partitions that hold rows
        (truncating all of batonq's partitions and indexes takes long)."""
        leaves: list[str] = []
        for table in self.tables:
            rows = admin.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {table}").fetchall()
            leaves += [str(leaf) for (leaf,) in rows]
        if leaves:
            admin.execute(f"TRUNCATE {', '.join(leaves)}")

    def vacuum(self, admin: psycopg.Connection[Any]) -> None:
        for table in self.tables:
            admin.execute(f"VACUUM (ANALYZE) {table}")


class Batonq(Target):
    """batonq through its synchronous client, one pool shared by the threads."""

    label = "batonq"
    tables = (
        "batonq.tasks",
        "batonq.archive",
        "batonq.submits",
        "batonq.idempotency_keys",
        "batonq.finished_counts",
    )

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.client: batonq.Client | None = None

    def open(self, connections: int) -> None:
        self.client = batonq.connect(
            self.dsn, min_connections=connections, max_connections=connections, listen=False
        )

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def _client(self) -> batonq.Client:
        assert self.client is not None, "open() first"
        return self.client

    def enqueue(self, slot: int, payloads: list[dict[str, Any]]) -> int:
        client = self._client()
        if len(payloads) == 1:
            client.enqueue(QUEUE, payloads[0])
            return 1
        return len(client.enqueue_many(QUEUE, payloads))

    def claim_complete(self, slot: int, batch: int) -> int:
        client = self._client()
        leases = client.claim(QUEUE, max_tasks=batch)
        if not leases:
            return 0
        if batch == 1:
            for lease in leases:
                client.complete(lease.lease_token, RESULT)
        else:
            replies = client.complete_many([(lease.lease_token, RESULT) for lease in leases])
            if not all(reply.outcome == "accepted" for reply in replies):
                raise RuntimeError(f"batonq refused a completion: {replies}")
        return len(leases)

    def preload(self, admin: psycopg.Connection[Any], n: int) -> None:
        client = self._client()
        for start in range(0, n, 10_000):
            client.enqueue_many(QUEUE, make_payloads(start, min(10_000, n - start)))

    def count(self, admin: psycopg.Connection[Any], op: Op) -> int:
        if op == "enqueue":
            row = admin.execute("SELECT count(*) FROM batonq.tasks WHERE state = 'pending'").fetchone()
        else:
            row = admin.execute(
                "SELECT count(*) FROM batonq.archive WHERE state = 'done'"
                " AND NOT EXISTS (SELECT FROM batonq.tasks)"
            ).fetchone()
        assert row is not None
        return int(row[0])


BASELINE_SCHEMA = """
CREATE TABLE IF NOT EXISTS public.bench_tasks (
    id               bigserial PRIMARY KEY,
    queue            text NOT NULL,
    state            text NOT NULL DEFAULT 'pending',
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    worker           text,
    result           jsonb,
    finished_at      timestamptz
);
CREATE INDEX IF NOT EXISTS bench_tasks_claim_idx
    ON public.bench_tasks (queue, priority DESC, run_at, id) WHERE state = 'pending';
"""

BASE_INSERT = "INSERT INTO public.bench_tasks (queue, payload) VALUES (%s, %s) RETURNING id"
BASE_INSERT_MANY = (
    "INSERT INTO public.bench_tasks (queue, payload) SELECT %s, p FROM unnest(%s::jsonb[]) AS p RETURNING id"
)
BASE_CLAIM = """
UPDATE public.bench_tasks
   SET state = 'leased', attempts = attempts + 1,
       lease_expires_at = now() + interval '300 seconds', worker = %s
 WHERE id IN (SELECT id FROM public.bench_tasks
               WHERE queue = %s AND state = 'pending' AND run_at <= now()
               ORDER BY priority DESC, run_at, id
               LIMIT %s
                 FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
BASE_DONE = (
    "UPDATE public.bench_tasks SET state = 'done', result = %s, finished_at = now()"
    " WHERE id = %s AND state = 'leased'"
)
BASE_DONE_MANY = """
UPDATE public.bench_tasks t
   SET state = 'done', result = u.res, finished_at = now()
  FROM unnest(%s::bigint[], %s::jsonb[]) AS u(id, res)
 WHERE t.id = u.id AND t.state = 'leased'
"""


class Baseline(Target):
    """A hand-written loop on a plain table: one connection per thread.

    Claimed rows are updated in place (no archive, no ledger, no tokens); the
    table has the same kind of partial claim index as batonq's hot table.
    """

    label = "baseline"
    tables = ("public.bench_tasks",)

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.conns: list[psycopg.Connection[Any]] = []
        self.worker = f"baseline:{os.getpid()}"

    def open(self, connections: int) -> None:
        self.conns = [psycopg.connect(self.dsn, autocommit=True) for _ in range(connections)]

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns = []

    def enqueue(self, slot: int, payloads: list[dict[str, Any]]) -> int:
        conn = self.conns[slot]
        if len(payloads) == 1:
            conn.execute(BASE_INSERT, (QUEUE, Jsonb(payloads[0]))).fetchall()
            return 1
        return len(conn.execute(BASE_INSERT_MANY, (QUEUE, [Jsonb(p) for p in payloads])).fetchall())

    def claim_complete(self, slot: int, batch: int) -> int:
        conn = self.conns[slot]
        # Unprepared, so planned with its LIMIT every time: as a prepared
        # statement PostgreSQL may switch to a generic plan for it, a hash
        # semi-join over the whole table.
        rows = conn.execute(BASE_CLAIM, (self.worker, QUEUE, batch), prepare=False).fetchall()
        if not rows:
            return 0
        if batch == 1:
            done = conn.execute(BASE_DONE, (Jsonb(RESULT), rows[0][0])).rowcount
        else:
            ids = [row[0] for row in rows]
            done = conn.execute(BASE_DONE_MANY, (ids, [Jsonb(RESULT)] * len(ids))).rowcount
        if done != len(rows):
            raise RuntimeError(f"baseline marked {done} of {len(rows)} tasks done")
        return len(rows)

    def preload(self, admin: psycopg.Connection[Any], n: int) -> None:
        for start in range(0, n, 10_000):
            chunk = [Jsonb(p) for p in make_payloads(start, min(10_000, n - start))]
            admin.execute(BASE_INSERT_MANY, (QUEUE, chunk))

    def count(self, admin: psycopg.Connection[Any], op: Op) -> int:
        state = "pending" if op == "enqueue" else "done"
        row = admin.execute(
            "SELECT count(*) FILTER (WHERE state = %s), count(*) FROM public.bench_tasks", (state,)
        ).fetchone()
        assert row is not None
        return int(row[0]) if row[0] == row[1] else -1
