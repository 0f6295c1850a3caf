"""One claimed task in a worker, from claim to outcome: run the handler
(on the loop or in a thread), heartbeat the lease meanwhile, and submit
what the handler produced -- or give the lease back at shutdown."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

import psycopg

from batonq import tracing
from batonq.client import AsyncClient
from batonq.errors import LeaseLost, PayloadTooLarge
from batonq.json_values import JsonText, json_text
from batonq.limits import MAX_BODY_BYTES
from batonq.models import JSON, Lease, Submitted, task_ref
from batonq.worker.app import TaskSpec
from batonq.worker.batching import Completions
from batonq.worker.failure import FailArguments, failure_of, fit_text
from batonq.worker.job import AsyncJob, BaseJob, Job
from batonq.worker.middleware import Middleware, Outcome, run_after, run_before

__all__ = ["Execution"]

log = logging.getLogger("batonq.worker")
T = TypeVar("T")

_SUBMIT_TRIES = 5
_RETRY_BASE_S = 0.5
_RETRY_MAX_S = 10.0


class _Cancelled:
    """The handler was cancelled because its lease was lost: nothing to submit."""


_CANCELLED = _Cancelled()
Produced = JSON | BaseException | _Cancelled


class Execution:
    """Runs one job. ``phase`` goes running -> submitting -> finished, or
    running -> released when the worker gives the lease back first.

    ``on_ran`` is called once the handler has returned (its slot is free
    while the outcome is being submitted), ``on_finished`` once the outcome
    is submitted."""

    def __init__(
        self,
        lease: Lease,
        spec: TaskSpec,
        *,
        client: AsyncClient,
        completions: Completions,
        executor: Executor,
        middleware: Sequence[Middleware],
        log_fields: dict[str, Any],
        on_ran: Callable[[Execution], None],
        on_finished: Callable[[Execution], None],
    ) -> None:
        loop = asyncio.get_running_loop()
        job_type = AsyncJob if spec.is_async else Job
        self.job: BaseJob = job_type(lease, client, loop, self.lose)
        self.spec = spec
        self.started = time.monotonic()
        self.phase = "running"
        self.lost: LeaseLost | None = None
        self.status = ""
        """The outcome's status once submitted (``Outcome.status``)."""
        self._client = client
        self._completions = completions
        self._loop = loop
        self._executor = executor
        self._middleware = middleware
        self._worker_fields = log_fields
        self._on_ran = on_ran
        self._on_finished = on_finished
        self._in_handler = False
        self._beat_due = math.inf
        self._heartbeat: asyncio.Task[None] | None = None
        self._thread_busy = False
        self.task = loop.create_task(self._run(), name=f"batonq-{task_ref(lease.task_id)}")

    @property
    def duration_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def thread_busy(self) -> bool:
        """A sync handler still running in its thread."""
        return self._thread_busy

    @property
    def _fields(self) -> dict[str, Any]:
        """The fields of this job's log records (built only when one is logged)."""
        return {**self._worker_fields, **self.job.log_fields()}

    def lose(self, lost: LeaseLost) -> None:
        """The lease is gone: tell the handler (a flag, and a cancellation
        for async handlers); whatever it returns will be refused."""
        if self.lost is not None or self.phase != "running":
            return
        self.lost = lost
        self.job.lease_lost.set()
        log.warning("lease of t_%d lost: %s", self.job.id, lost.message,
                    extra={**self._fields, "state": lost.state})  # fmt: skip
        self._cancel_handler()

    def _cancel_handler(self) -> None:
        # An async handler runs inside this execution's own task (no task of
        # its own per job): cancelling it means cancelling that task while it
        # is in the handler; _produce tells this apart from the worker's own
        # cancellation by ``lost`` and ``phase``. From inside the handler
        # (set_stage raising LeaseLost) the error already reaches it.
        if self._in_handler and asyncio.current_task() is not self.task:
            self.task.cancel()

    # -- the run -------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._run_job()
        finally:
            self.job._detach()

    async def _run_job(self) -> None:
        with tracing.process(self.job.lease) as span:
            self._schedule_heartbeat()
            try:
                produced = await self._produce()
            finally:
                self._stop_heartbeats()
                self._on_ran(self)
            if self.phase == "released":
                tracing.outcome(span, "released")
                return  # the worker gave the lease back and accounts for it
            self.phase = "submitting"
            outcome = await self._submit(produced)
            tracing.outcome(span, outcome.status, outcome.error)
        self.phase = "finished"
        if self._middleware:
            await run_after(self._middleware, self.job, outcome)
        self._log(outcome)
        self.status = outcome.status
        self._on_finished(self)

    async def _produce(self) -> Produced:
        """Run the before_job hooks and the handler: what the handler
        returned or raised (an error in before_job counts as the handler's)."""
        try:
            if self._middleware:
                await run_before(self._middleware, self.job)
            if self.lost is not None or self.phase == "released":
                return _CANCELLED  # lost or shut down while before_job ran: do not start
            if not self.spec.is_async:
                context = contextvars.copy_context()
                return await self._loop.run_in_executor(self._executor, self._in_thread, context)
            self._in_handler = True
            try:
                return await self.spec.handler(self.job)
            finally:
                self._in_handler = False
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                if self.lost is None and self.phase != "released":
                    raise  # the worker itself is being cancelled
                current.uncancel()
                return _CANCELLED
            return asyncio.CancelledError("the handler was cancelled")
        except Exception as error:
            return error

    def _in_thread(self, context: contextvars.Context) -> Any:
        self._thread_busy = True
        try:
            return context.run(self.spec.handler, self.job)
        finally:
            self._thread_busy = False

    # Heartbeats: a due time per job, which the worker's tick looks at (no
    # timer per job: most jobs end long before one is due), and a task only
    # when one is.

    def _schedule_heartbeat(self) -> None:
        self._beat_due = time.monotonic() + self.job.lease.lease_expires_in_s / 3

    def beat_if_due(self, now: float) -> None:
        """Start a heartbeat if one is due (the worker's tick calls this)."""
        if now >= self._beat_due:
            self._beat_due = math.inf  # until this one is answered
            self._heartbeat = self._loop.create_task(self._send_heartbeat())

    async def _send_heartbeat(self) -> None:
        """Extend the lease; the next one is due a third of a lease later."""
        try:
            await self._client.heartbeat(self.job.lease_token)
        except LeaseLost as lost:
            self.lose(lost)
            return
        except psycopg.OperationalError as error:
            log.warning("heartbeat of t_%d failed (%s); trying again", self.job.id, error,
                        extra=self._fields)  # fmt: skip
        if self.phase == "running":
            self._schedule_heartbeat()

    def _stop_heartbeats(self) -> None:
        self._beat_due = math.inf
        if self._heartbeat is not None:
            self._heartbeat.cancel()

    # -- submit --------------------------------------------------------------

    async def _submit(self, produced: Produced) -> Outcome:
        """Complete or fail the task with what the handler produced. After a
        lost lease it is still sent: the engine refuses it and records it."""
        if isinstance(produced, _Cancelled):
            return Outcome("lease_lost", duration_s=self.duration_s)
        try:
            if isinstance(produced, BaseException):
                return await self._fail(produced, failure_of(produced))
            return await self._complete(produced)
        except LeaseLost as lost:
            self.lost = self.lost or lost
            if isinstance(produced, BaseException):
                return Outcome("lease_lost", error=produced, duration_s=self.duration_s)
            return Outcome("lease_lost", result=produced, duration_s=self.duration_s)
        except Exception as error:  # the database is gone, or a bug: never hold the slot
            log.error("could not submit t_%d (%s): it comes back when its lease expires", self.job.id,
                      error, exc_info=not isinstance(error, psycopg.OperationalError),
                      extra=self._fields)  # fmt: skip
            return Outcome("unsubmitted", error=error, duration_s=self.duration_s)

    async def _complete(self, result: JSON) -> Outcome:
        token = self.job.lease_token
        try:
            text = JsonText(json_text(result))
        except (TypeError, ValueError) as error:
            bad = ValueError(f"the handler's result is not JSON: {error}")
            return await self._fail(bad, FailArguments(str(bad), requeue=False))
        try:
            await self._send(lambda: self._completions.complete(token, text))
        except (PayloadTooLarge, psycopg.DataError) as error:
            return await self._fail(error, FailArguments(f"result refused: {error}", requeue=False))
        return Outcome("done", result=result, duration_s=self.duration_s)

    async def _fail(self, error: BaseException, failure: FailArguments) -> Outcome:
        token = self.job.lease_token

        def send(text: str) -> Awaitable[Submitted]:
            return self._client.fail(token, text, retry_delay_s=failure.retry_delay_s,
                                     requeue=failure.requeue)  # fmt: skip

        try:
            reply = await self._send(lambda: send(failure.error))
        except PayloadTooLarge as too_large:  # the queue's limit is below the default
            limit = int(too_large.detail.get("limit", MAX_BODY_BYTES // 2))
            reply = await self._send(lambda: send(fit_text(failure.error, limit)))
        return Outcome("dead" if reply.state == "dead" else "retry", error=error, duration_s=self.duration_s)

    async def _send(self, call: Callable[[], Awaitable[T]]) -> T:
        """A submit, retried while the database is unreachable: a repeat of
        an accepted one is a harmless replay."""
        for attempt in range(_SUBMIT_TRIES - 1):
            try:
                return await call()
            except psycopg.OperationalError as error:
                log.warning("submit of t_%d failed (%s); trying again", self.job.id, error,
                            extra=self._fields)  # fmt: skip
                await asyncio.sleep(min(_RETRY_BASE_S * 2**attempt, _RETRY_MAX_S))
        return await call()

    def _log(self, outcome: Outcome) -> None:
        # A task done is logged at DEBUG (the worker's summary line counts
        # them at INFO): a record per task cost a busy worker a third of
        # its throughput. Only the check runs when DEBUG is off.
        if outcome.status == "done" and not log.isEnabledFor(logging.DEBUG):
            return
        extra = {**self._fields, "outcome": outcome.status, "duration_s": round(outcome.duration_s, 6)}
        error = outcome.error
        if outcome.status == "done":
            log.debug("t_%d done in %.3f s", self.job.id, outcome.duration_s, extra=extra)
        elif outcome.status in ("lease_lost", "unsubmitted"):
            log.warning("t_%d: outcome not accepted (%s)", self.job.id, outcome.status, extra=extra)
        else:
            summary = f"{type(error).__name__}: {error}" if error is not None else "failed"
            verdict = "will retry" if outcome.status == "retry" else "is dead"
            log.warning("t_%d %s: %s", self.job.id, verdict, summary, extra=extra)

    # -- shutdown ------------------------------------------------------------

    def stop(self) -> None:
        """Shutdown: stop heartbeating, tell the handler its lease is going
        (cancel an async one), and drop whatever it will produce."""
        self.phase = "released"
        self.job.lease_lost.set()
        self._stop_heartbeats()
        self._cancel_handler()

    async def release(self) -> None:
        """Give the lease back: the task is claimable again at once."""
        try:
            await self._client.release_lease(self.job.lease_token)
        except LeaseLost as lost:
            log.info("t_%d not released: %s", self.job.id, lost.message, extra=self._fields)
        except psycopg.Error as error:
            log.warning("could not release t_%d (%s): it comes back when its lease expires", self.job.id,
                        error, extra=self._fields)  # fmt: skip
        else:
            log.info("released t_%d: claimable again now", self.job.id,
                     extra={**self._fields, "outcome": "released"})  # fmt: skip
        if self._middleware:
            await run_after(self._middleware, self.job, Outcome("released", duration_s=self.duration_s))
