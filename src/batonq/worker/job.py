"""The handle a handler receives: the claimed task, plus what it may do while
it holds the lease. ``AsyncJob`` for ``async def`` handlers, ``Job`` (the same,
with plain methods) for sync handlers running in the worker's threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from batonq.client import AsyncClient
from batonq.errors import LeaseLost
from batonq.models import JSON, Enqueued, Lease, task_ref

__all__ = ["AsyncJob", "BaseJob", "Job"]

T = TypeVar("T")

# Long enough for any one engine call; a sync handler never blocks forever on
# a worker loop that has gone away.
_CALL_TIMEOUT_S = 60.0


class BaseJob:
    """A claimed task: its identity, payload and lease.

    - ``attempt`` counts claims, this one included; ``max_attempts`` is its limit.
    - ``fencing_token`` grows with every claim: pass it to downstream systems
      that can refuse writes carrying an older one.
    - ``lease_lost`` is set when the worker learns the lease is gone (another
      holder has the task, it was cancelled, or the worker shut down and gave
      it back): stop working, your result will be refused.
    - ``group``: the task's group (``None`` for none), what the queue's
      ``group_max_leased`` and ``group_rate_limit`` count.
    - ``context``: a dict for middleware (and handlers) to keep state per job.
    """

    def __init__(
        self,
        lease: Lease,
        client: AsyncClient,
        loop: asyncio.AbstractEventLoop,
        on_lease_lost: Callable[[LeaseLost], None],
    ) -> None:
        self.lease = lease
        self.id = lease.task_id
        self.queue = lease.queue
        self.payload: JSON = lease.row
        self.attempt = lease.attempt
        self.max_attempts = lease.max_attempts
        self.fencing_token = lease.fencing_token
        self.lease_token = lease.lease_token
        self.parent_id = lease.parent_id
        self.root_id = lease.root_id
        self.priority = lease.priority
        self.group = lease.group
        self.context: dict[str, Any] = {}
        self._client = client
        self._loop = loop
        self._on_lease_lost: Callable[[LeaseLost], None] | None = on_lease_lost

    @property
    def lease_lost(self) -> threading.Event:
        # Made on first use: most jobs never look. setdefault keeps it one
        # Event when the loop and a handler thread ask at the same time.
        event: threading.Event | None = self.__dict__.get("_lease_lost")
        if event is None:
            event = self.__dict__.setdefault("_lease_lost", threading.Event())
        return event

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {task_ref(self.id)} {self.queue} attempt {self.attempt}>"

    def _detach(self) -> None:
        """The job is over: its worker no longer listens for a lost lease.
        (This also breaks the job <-> execution reference cycle, so both are
        freed at once instead of by the cyclic garbage collector.)"""
        self._on_lease_lost = None

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def log_fields(self) -> dict[str, Any]:
        """The fields every log record about this job carries."""
        return {
            "task_id": task_ref(self.id),
            "queue": self.queue,
            "attempt": self.attempt,
            "fencing_token": self.fencing_token,
        }

    async def _set_stage(self, stage: str) -> None:
        try:
            await self._client.set_stage(self.lease_token, stage)
        except LeaseLost as lost:
            if self._on_lease_lost is not None:
                self._on_lease_lost(lost)
            raise

    async def _enqueue_child(self, queue: str, payload: JSON, **options: Any) -> Enqueued:
        return await self._client.enqueue(queue, payload, parent=self.id, **options)


class AsyncJob(BaseJob):
    """The job handle of an ``async def`` handler.

    Usage::

        @app.task("shop:tasks")
        async def ship(job: batonq.AsyncJob) -> dict:
            await job.set_stage("packing")
            await job.enqueue_child("shop:emails", {"order": job.payload["order"]})
            return {"shipped": True}
    """

    async def set_stage(self, stage: str) -> None:
        """Record what the handler is doing now (shown on the task); also
        extends the lease. Raises ``LeaseLost`` when the lease is gone."""
        await self._set_stage(stage)

    async def enqueue_child(self, queue: str, payload: JSON, **options: Any) -> Enqueued:
        """Enqueue a task linked to this one (``parent_id``, same ``root_id``).

        ``options`` are ``AsyncClient.enqueue``'s (``idempotency_key``, ``delay_s``, ...).
        A handler can run twice, so pass ``idempotency_key=`` to enqueue a child only once.
        """
        return await self._enqueue_child(queue, payload, **options)


class Job(BaseJob):
    """The job handle of a sync handler (run in a worker thread): the same as
    ``AsyncJob``, with plain methods.

    Usage::

        @app.task("shop:tasks")
        def ship(job: batonq.Job) -> dict:
            job.set_stage("packing")
            if job.lease_lost.is_set():
                return None  # refused anyway: someone else has the task
            return {"shipped": True}
    """

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coroutine.close()
            raise RuntimeError("Job methods block: call them from the handler's thread, not the event loop")
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        except RuntimeError:  # the worker's loop is closed: it has stopped
            coroutine.close()
            raise
        return future.result(timeout=_CALL_TIMEOUT_S)

    def set_stage(self, stage: str) -> None:
        """Record what the handler is doing now (shown on the task); also
        extends the lease. Raises ``LeaseLost`` when the lease is gone."""
        self._call(self._set_stage(stage))

    def enqueue_child(self, queue: str, payload: JSON, **options: Any) -> Enqueued:
        """Enqueue a task linked to this one (``parent_id``, same ``root_id``).

        ``options`` are ``Client.enqueue``'s (``idempotency_key``, ``delay_s``, ...).
        A handler can run twice, so pass ``idempotency_key=`` to enqueue a child only once.
        """
        return self._call(self._enqueue_child(queue, payload, **options))
