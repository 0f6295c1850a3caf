"""A worker app for bench_latency.py: each handler start appends
``now - payload["sent"]`` (seconds, wall clock of this machine) to the file
named by $BATONQ_BENCH_LATENCY_FILE."""

from __future__ import annotations

import os
import time

import batonq

app = batonq.App()
_out = open(os.environ["BATONQ_BENCH_LATENCY_FILE"], "a", buffering=1)  # noqa: SIM115 - lives as long as the worker


@app.task("latency")
async def record(job: batonq.AsyncJob) -> None:
    _out.write(f"{time.time() - job.payload['sent']:.6f}\n")
