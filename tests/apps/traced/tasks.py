"""A worker app, and an enqueuer, that record their spans with the
OpenTelemetry SDK's in-memory exporter and write them out as JSON lines to
``$BATONQ_TEST_SPANS`` when the process exits (tests/worker/test_tracing.py)."""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import batonq

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def _dump() -> None:
    with open(os.environ["BATONQ_TEST_SPANS"], "a", encoding="utf-8") as out:
        for span in exporter.get_finished_spans():
            out.write(span.to_json(indent=None) + "\n")


atexit.register(_dump)

app = batonq.App()


@app.task("trace:a")
async def first(job: batonq.AsyncJob) -> dict[str, Any]:
    return {"n": job.payload["n"] + 1}


@app.task("trace:b")
def second(job: batonq.Job) -> dict[str, Any]:
    return {"n": job.payload["n"] + 1}


@app.task("trace:c")
async def third(job: batonq.AsyncJob) -> dict[str, Any]:
    if job.attempt == 1:
        raise batonq.Retry(delay_s=0, message="first attempt fails")
    return {"n": job.payload["n"]}


if __name__ == "__main__":  # the enqueuer: one task into trace:a inside a span of its own
    with batonq.connect(listen=False) as client, trace.get_tracer("shop").start_as_current_span("checkout"):
        client.enqueue("trace:a", {"n": int(sys.argv[1])})
