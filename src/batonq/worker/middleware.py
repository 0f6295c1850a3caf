"""Hooks around every job, for logging, metrics and tracing without forking
the worker; and the ``Outcome`` they are told about."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batonq.models import JSON

if TYPE_CHECKING:
    from batonq.worker.job import BaseJob

__all__ = ["OUTCOMES", "Middleware", "Outcome", "run_after", "run_before"]

log = logging.getLogger("batonq.worker")

OUTCOMES = ("done", "retry", "dead", "lease_lost", "released", "unsubmitted")
"""What became of a job:

- ``done``: completed with the handler's result;
- ``retry``: failed, and the task is pending again (``Retry`` or an exception);
- ``dead``: failed for good (``PermanentError``, or out of attempts);
- ``lease_lost``: the lease went to someone else; the result was refused (or
  never produced: an async handler is cancelled);
- ``released``: the worker shut down first and gave the lease back;
- ``unsubmitted``: the outcome could not be sent (the database was
  unreachable): the task comes back when its lease expires.
"""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a job came to. ``error`` is the exception the handler raised,
    ``result`` the value it returned, ``duration_s`` from claim to submit."""

    status: str
    result: JSON = None
    error: BaseException | None = None
    duration_s: float = 0.0


class Middleware:
    """Override either hook, as a plain or an ``async`` method; both run on
    the worker's event loop, so keep sync ones quick.

    ``before_job`` runs before the handler: raising there fails the job as if
    the handler had raised (so ``raise batonq.Retry(...)`` defers it).
    ``after_job`` runs once the outcome is submitted; its errors are logged
    and ignored. ``job.context`` is a dict to carry state from one to the other.

    Usage::

        class Timing(batonq.Middleware):
            def after_job(self, job, outcome):
                metrics.observe(job.queue, outcome.status, outcome.duration_s)

        app.middleware(Timing())
    """

    def before_job(self, job: BaseJob) -> Awaitable[None] | None:
        return None

    def after_job(self, job: BaseJob, outcome: Outcome) -> Awaitable[None] | None:
        return None


async def run_before(middleware: Sequence[Middleware], job: BaseJob) -> None:
    """Every ``before_job``, in order; the first error propagates."""
    for hook in middleware:
        pending = hook.before_job(job)
        if inspect.isawaitable(pending):
            await pending


async def run_after(middleware: Sequence[Middleware], job: BaseJob, outcome: Outcome) -> None:
    """Every ``after_job``, in reverse order; errors are logged, not raised."""
    for hook in reversed(middleware):
        try:
            pending = hook.after_job(job, outcome)
            if inspect.isawaitable(pending):
                await pending
        except Exception:
            log.exception("after_job of %r failed", hook, extra=job.log_fields())
