"""Handlers that the process tests run with ``batonq worker
tests.worker.worker_apps:app``. Each sleeps ``payload["sleep"]`` seconds and
returns who ran it."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import batonq

app = batonq.App()


@app.task("proc:sync")
def sleep_sync(job: batonq.Job) -> dict[str, Any]:
    time.sleep(job.payload["sleep"])
    return {"slept": job.payload["sleep"], "pid": os.getpid(), "attempt": job.attempt}


@app.task("proc:async")
async def sleep_async(job: batonq.AsyncJob) -> dict[str, Any]:
    await asyncio.sleep(job.payload["sleep"])
    return {"slept": job.payload["sleep"], "pid": os.getpid(), "attempt": job.attempt}
