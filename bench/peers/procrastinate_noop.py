"""Procrastinate: an App with one async no-op task, and a batch enqueuer.

procrastinate --app procrastinate_noop.app worker -c 10 --one-shot  # $BENCH_DSN
python procrastinate_noop.py enqueue N BATCH
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import procrastinate

QUEUE = "bench_workers"

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DSN", "")))


@app.task(name="noop", queue=QUEUE)
async def noop() -> None:
    return None


async def enqueue(n: int, batch: int) -> None:
    """Prints the seconds the defer calls took."""
    async with app.open_async():
        started = time.perf_counter()
        done = 0
        while done < n:
            size = min(batch, n - done)
            if size == 1:
                await noop.defer_async()
            else:
                await noop.batch_defer_async(*({} for _ in range(size)))
            done += size
        print(time.perf_counter() - started)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "enqueue":
        sys.exit(__doc__)
    asyncio.run(enqueue(int(sys.argv[2]), int(sys.argv[3])))
