"""Traces through OpenTelemetry's API, recorded when the program has set up
a tracer provider (the SDK's, or ``opentelemetry-instrument``'s).

Without one every helper here returns at once: no span is started and no
context is stored. ``batonq[otel]`` adds the HTTP door's spans (the ASGI
instrumentation); the MCP SDK spans MCP requests itself.

A task carries the W3C trace context of the span that enqueued it
(``trace_context``: ``{"traceparent": ..., "tracestate": ...}``); the
worker's ``process`` span is that span's child, in another process. The run
that completes a task hands its own context to the task's batons, so one
trace follows a task along the queue graph. Names and attributes follow
OpenTelemetry's messaging conventions: ``send``, ``receive``, ``process``
and ``settle`` spans named ``"{operation} {queue}"``, with
``messaging.system`` = ``batonq``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from batonq.models import JSON, task_ref
from batonq.version import VERSION

if TYPE_CHECKING:
    from batonq.models import Lease

__all__ = [
    "asgi_middleware", "clock_ns", "context_of", "current", "enabled", "outcome", "process",
    "received", "send", "sent", "settle",
]  # fmt: skip

_SYSTEM = "batonq"
_W3C = TraceContextTextMapPropagator()
_tracer = trace.get_tracer("batonq", VERSION)
_UNSET = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def enabled() -> bool:
    """Whether the program has set up a tracer provider (spans are recorded);
    checked on every call, so a provider set up after import counts."""
    return not isinstance(trace.get_tracer_provider(), _UNSET)


def _attributes(queue: str, operation: str, name: str, **more: Any) -> dict[str, Any]:
    return {
        "messaging.system": _SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": operation,
        "messaging.operation.name": name,
        **{key: value for key, value in more.items() if value is not None},
    }


def context_of(span: Any) -> dict[str, str] | None:
    """The W3C trace context of ``span`` as a carrier to store with a task,
    or None when there is nothing to carry (no OpenTelemetry, no SDK, or a
    span that is not recording)."""
    if span is None or not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, trace.set_span_in_context(span))
    return carrier or None


def current() -> dict[str, str] | None:
    """The current span's trace context (a worker's run, inside its handler)."""
    return context_of(trace.get_current_span()) if enabled() else None


def _extract(carrier: JSON) -> Any:
    """The context stored with a task, or None (a root span) when it has none."""
    if not isinstance(carrier, Mapping):
        return None
    return _W3C.extract({str(k): str(v) for k, v in carrier.items() if isinstance(v, str)})


@contextlib.contextmanager
def send(queue: str, count: int, name: str = "enqueue") -> Iterator[Any]:
    """The span of an enqueue of ``count`` tasks (a PRODUCER span); yields
    it, or None without OpenTelemetry."""
    if not enabled():
        yield None
        return
    batch = count if name == "enqueue_many" else None
    with _tracer.start_as_current_span(
        f"send {queue}", kind=trace.SpanKind.PRODUCER,
        attributes=_attributes(queue, "send", name, **{"messaging.batch.message_count": batch}),
    ) as span:  # fmt: skip
        yield span


def sent(span: Any, task_ids: Sequence[int]) -> None:
    """Name the task an enqueue made (one task: its id)."""
    if span is not None and len(task_ids) == 1:
        span.set_attribute("messaging.message.id", task_ref(task_ids[0]))


def _links(carriers: Sequence[JSON]) -> list[Any]:
    """Links to the spans that ``carriers`` name (those that name one), each
    once (a batch whose items share a run names it once per item)."""
    contexts = (trace.get_current_span(_extract(c)).get_span_context() for c in carriers if c)
    unique = {(c.trace_id, c.span_id): c for c in contexts if c.is_valid}
    return [trace.Link(context) for context in unique.values()]


def received(queue: str, leases: Sequence[Lease], started_ns: int) -> None:
    """Record a claim that got ``leases`` (a ``receive`` span from
    ``started_ns`` to now, linked to the spans that enqueued them); claims
    that found nothing record none, so an idle worker's polls leave no trace."""
    if not leases or not enabled():
        return
    _tracer.start_span(
        f"receive {queue}", kind=trace.SpanKind.CLIENT, start_time=started_ns,
        links=_links([lease.trace_context for lease in leases]),
        attributes=_attributes(queue, "receive", "claim", **{"messaging.batch.message_count": len(leases)}),
    ).end()  # fmt: skip


def clock_ns() -> int:
    """The time a span's start is given in (for ``received``)."""
    return time.time_ns()


@contextlib.contextmanager
def process(lease: Lease) -> Iterator[Any]:
    """The span of one run of a task's handler (a CONSUMER span), the child of
    the span that enqueued the task (or of the run that handed it on). Current
    while it runs, so what the handler enqueues joins the trace."""
    if not enabled():
        yield None
        return
    with _tracer.start_as_current_span(
        f"process {lease.queue}", context=_extract(lease.trace_context), kind=trace.SpanKind.CONSUMER,
        attributes=_attributes(
            lease.queue, "process", "process", **{
                "messaging.message.id": task_ref(lease.task_id),
                "batonq.task.attempt": lease.attempt,
                "batonq.lease.fencing_token": lease.fencing_token,
            }),
    ) as span:  # fmt: skip
        yield span


def outcome(span: Any, status: str, error: BaseException | None = None) -> None:
    """What became of the run: ``done``, ``retry``, ``dead``, ``lease_lost``,
    ``released`` or ``unsubmitted``; an error the handler raised is recorded."""
    if span is None:
        return
    span.set_attribute("batonq.outcome", status)
    if error is not None:
        span.record_exception(error)
    if status != "done":
        span.set_status(trace.Status(trace.StatusCode.ERROR, status))


@contextlib.contextmanager
def settle(queue: str, name: str, count: int, runs: Sequence[JSON] = ()) -> Iterator[Any]:
    """The span of a complete or fail of ``count`` leases (a CLIENT span),
    linked to the ``runs`` it settles (a batch's, when it is not their child)."""
    if not enabled():
        yield None
        return
    batch = count if count > 1 else None
    with _tracer.start_as_current_span(
        f"settle {queue}", kind=trace.SpanKind.CLIENT, links=_links(runs),
        attributes=_attributes(queue, "settle", name, **{"messaging.batch.message_count": batch}),
    ) as span:  # fmt: skip
        yield span


def asgi_middleware() -> Any:
    """OpenTelemetry's ASGI middleware (HTTP server spans, the caller's
    ``traceparent`` header as their parent), or None without ``batonq[otel]``."""
    try:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    except ImportError:
        return None
    return OpenTelemetryMiddleware
