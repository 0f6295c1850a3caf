"""A worker app for bench_graph.py: one async handler per step of the
pipeline ``bench:a -> bench:b -> bench:c``. Each returns its payload with its
step's letter appended to ``path``, so a finished ``bench:c`` task's result
``{"n": n, "path": ["a", "b", "c"]}`` shows the baton passed through a and b."""

from __future__ import annotations

from typing import Any

import batonq

QUEUES = ("bench:a", "bench:b", "bench:c")

app = batonq.App()


def _step(payload: Any, letter: str) -> dict[str, Any]:
    return {"n": payload["n"], "path": [*payload["path"], letter]}


@app.task("bench:a")
async def step_a(job: batonq.AsyncJob) -> dict[str, Any]:
    return _step(job.payload, "a")


@app.task("bench:b")
async def step_b(job: batonq.AsyncJob) -> dict[str, Any]:
    return _step(job.payload, "b")


@app.task("bench:c")
async def step_c(job: batonq.AsyncJob) -> dict[str, Any]:
    return _step(job.payload, "c")
