"""Talos-Queue's words over batonq: a program written for Talos-Queue runs
on batonq when its import line and its connection change (docs/talos.md).

Usage::

    from batonq.talos import LeaseQueue, PermanentError, run_worker

    queue = LeaseQueue("postgresql://app@db/mydb")
    queue.enqueue(kind="transcode", dedupe_key="video:892", payload={"video_id": 892})

    async def process_job(job):
        queue.set_stage(job.id, worker_id="worker-1", stage="encoding")
        return {"status": "success"}

    await run_worker(queue, process_job, worker_id="worker-1", kind="transcode")

A kind is the batonq queue of that name; a ``dedupe_key`` is an idempotency
key held while its task is unfinished (``enqueue(dedupe_key=...)``); a job
is the batonq task, and ``run_worker`` is a batonq ``Worker`` serving one
kind: heartbeats, retries with backoff, a refused result after a lost lease
all are the worker's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from batonq.client import AsyncClient
from batonq.client_sync import Client
from batonq.errors import InvalidArgument, PermanentError
from batonq.models import JSON, task_ref
from batonq.worker import App, AsyncJob, Job, Worker
from batonq.worker.app import is_async

__all__ = ["EnqueuedJob", "LeaseQueue", "PermanentError", "run_worker"]

Connection = str | Client | AsyncClient | ConnectionPool[Any] | AsyncConnectionPool[Any]


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """The answer to ``LeaseQueue.enqueue``: ``created`` is false when an
    unfinished job of the same kind and ``dedupe_key`` was returned instead."""

    id: int
    kind: str
    dedupe_key: str | None
    created: bool
    state: str
    run_at: datetime


def _dsn_of(connection: Connection) -> tuple[str, Client | None]:
    """Where to connect, and the batonq client to enqueue with if given one."""
    if isinstance(connection, str):
        return connection, None
    if isinstance(connection, Client):
        return connection.dsn, connection
    if isinstance(connection, AsyncClient):
        return connection.dsn, None
    if isinstance(connection, ConnectionPool | AsyncConnectionPool):
        if not isinstance(connection.conninfo, str):
            raise TypeError("LeaseQueue needs a pool made with a conninfo string: pass that URL instead")
        return connection.conninfo, None
    supabase_url = getattr(connection, "supabase_url", None)
    if isinstance(supabase_url, str) or type(connection).__module__.split(".")[0] == "supabase":
        raise TypeError(_not_supabase_py(supabase_url))
    raise TypeError(
        "LeaseQueue takes a PostgreSQL URL, a psycopg pool or a batonq client; "
        f"got {type(connection).__name__}"
    )


def _not_supabase_py(supabase_url: str | None) -> str:
    """What to pass instead of a supabase-py client (it speaks to Supabase's
    REST API; batonq's engine is SQL, reached by a database connection)."""
    host = urlsplit(supabase_url or "").hostname or ""
    project = host.removesuffix(".supabase.co") if host.endswith(".supabase.co") else "<project-ref>"
    return (
        "LeaseQueue needs a PostgreSQL connection, not a supabase-py client: pass the project's direct "
        f"connection string, postgresql://postgres:<password>@db.{project}.supabase.co:5432/postgres "
        "(Supabase dashboard: Connect, Direct connection); see docs/supabase.md"
    )


class LeaseQueue:
    """Talos-Queue's queue: enqueue jobs by kind, record a running job's stage.

    ``connection``: a PostgreSQL URL (``postgresql://...``), a psycopg pool
    (its ``conninfo`` is used: batonq opens its own connections there) or a
    batonq client. The database needs batonq's schema: ``batonq migrate``,
    or ``psql -f sql/batonq.sql``.

    Its calls block (one round trip each), as Talos-Queue's do; ``client``
    is the batonq ``Client`` behind it, for everything else batonq does.
    """

    def __init__(self, connection: Connection) -> None:
        self.dsn, self._given = _dsn_of(connection)
        self._client: Client | None = self._given
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, AsyncJob | Job]] = {}
        """Jobs whose handler runs in this process: id -> (worker_id, job)."""

    def __repr__(self) -> str:
        return f"<LeaseQueue running={sorted(self._running)}>"

    @property
    def client(self) -> Client:
        """The batonq client this queue calls (opened on first use)."""
        with self._lock:
            if self._client is None:
                self._client = Client(self.dsn, listen=False).open()
            return self._client

    def close(self) -> None:
        """Close the connections this queue opened (not a client it was given)."""
        with self._lock:
            client, self._client = self._client, self._given
        if client is not None and client is not self._given:
            client.close()

    def __enter__(self) -> LeaseQueue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def enqueue(
        self,
        *,
        kind: str,
        payload: JSON,
        dedupe_key: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        delay_s: float = 0.0,
    ) -> EnqueuedJob:
        """Enqueue a job of ``kind`` (the batonq queue of that name).

        With ``dedupe_key``, while a job of the same kind and key is
        unfinished (pending, running or waiting to retry), that job is
        returned (``created`` false) and nothing is enqueued; once it is
        finished or failed, the same key enqueues a new job. Higher
        ``priority`` runs first; ``max_attempts`` defaults to the queue's (3).
        """
        enqueued = self.client.enqueue(
            kind, payload, priority=priority, max_attempts=max_attempts, delay_s=delay_s,
            dedupe_key=dedupe_key,
        )  # fmt: skip
        return EnqueuedJob(
            enqueued.task_id, kind, dedupe_key, enqueued.created, enqueued.state, enqueued.run_at
        )

    def set_stage(self, job_id: int, *, worker_id: str, stage: str) -> None:
        """Record what the job is doing now (shown on the task; also extends
        its lease). For a job whose handler runs in this process under
        ``worker_id``; raises ``LeaseLost`` when the lease is gone."""
        with self._lock:
            running = self._running.get(job_id)
        if running is None or running[0] != worker_id:
            raise InvalidArgument(
                f"job {task_ref(job_id)} is not running under worker {worker_id!r} in this process: "
                "set_stage is for the job a handler of run_worker is working on"
            )
        self.client.set_stage(running[1].lease_token, stage)

    @contextlib.contextmanager
    def _running_job(self, job: AsyncJob | Job, worker_id: str) -> Iterator[None]:
        """While a handler runs: its job is known to ``set_stage``."""
        entry = (worker_id, job)
        with self._lock:
            self._running[job.id] = entry
        try:
            yield
        finally:
            with self._lock:
                if self._running.get(job.id) is entry:
                    del self._running[job.id]

    def _serving(self, handler: Callable[..., Any], worker_id: str) -> Callable[..., Any]:
        """``handler`` as a batonq handler, its jobs known to ``set_stage``."""
        if is_async(handler):

            async def serve_async(job: AsyncJob) -> JSON:
                with self._running_job(job, worker_id):
                    result: JSON = await handler(job)
                    return result

            return serve_async

        def serve(job: Job) -> JSON:
            with self._running_job(job, worker_id):
                result: JSON = handler(job)
                return result

        return serve


async def run_worker(
    queue: LeaseQueue,
    handler: Callable[..., Any],
    *,
    worker_id: str,
    kind: str,
    concurrency: int = 10,
    lease_s: int | None = None,
    handle_signals: bool = True,
) -> int:
    """Run ``handler`` on jobs of ``kind`` until cancelled (or, in the main
    thread, until SIGINT or SIGTERM: running jobs finish first).

    The handler gets the job (``job.id``, ``job.payload``, ``job.attempt``)
    and returns its result. ``PermanentError`` fails the job at once; any
    other exception retries it after the queue's exponential backoff, until
    ``max_attempts``. Leases are renewed in the background while a handler
    runs, so a job longer than ``lease_s`` (default: the queue's, 300 s) is
    never taken over; a result whose lease was lost anyway (the job
    cancelled, or the worker cut off from the database past its lease) is
    refused and dropped. ``concurrency`` jobs run at once; ``worker_id``
    names the worker on its claims. Returns the batonq worker's exit code
    (0 after a graceful stop).
    """
    if not isinstance(queue, LeaseQueue):
        raise TypeError(f"run_worker's first argument is a LeaseQueue, got {type(queue).__name__}")
    if not isinstance(worker_id, str) or not worker_id:
        raise InvalidArgument(f"worker_id must be a non-empty string (got {worker_id!r})")
    app = App()
    app.add_task(kind, queue._serving(handler, worker_id), lease_s=lease_s)
    worker = Worker(
        app, dsn=queue.dsn, name=worker_id, concurrency=concurrency, lease_s=lease_s,
        handle_signals=handle_signals,
    )  # fmt: skip
    return await worker.run_async()
