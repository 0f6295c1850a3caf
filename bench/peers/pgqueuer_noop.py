"""PgQueuer: a factory with one async no-op entrypoint, and a batch enqueuer.

python pgqueuer_noop.py work BATCH [MANAGERS]      # worker, drain mode ($BENCH_DSN)
python pgqueuer_noop.py enqueue N BATCH            # enqueue N jobs, BATCH per call
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

ENTRYPOINT = "noop"


async def create() -> PgQueuer:
    connection = await asyncpg.connect(os.environ["BENCH_DSN"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        return None

    return pgq


async def enqueue(n: int, batch: int) -> None:
    """Prints the seconds the enqueue calls took."""
    connection = await asyncpg.connect(os.environ["BENCH_DSN"])
    try:
        queries = Queries(AsyncpgDriver(connection))
        started = time.perf_counter()
        done = 0
        while done < n:
            size = min(batch, n - done)
            await queries.enqueue([ENTRYPOINT] * size, [None] * size, [0] * size)
            done += size
        print(time.perf_counter() - started)
    finally:
        await connection.close()


async def work(batch: int, managers: int = 1) -> None:
    """What ``pgq run pgqueuer_noop:create --batch-size B --mode drain`` does,
    without the CLI (whose logging set-up fails in pgqueuer 1.6 here); with
    MANAGERS > 1, that many queue managers in this process, each on its own
    connection, as its documentation suggests for more throughput."""
    instances = [await create() for _ in range(managers)]
    await asyncio.gather(*(pgq.run(batch_size=batch, mode=QueueExecutionMode.drain) for pgq in instances))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "enqueue":
        asyncio.run(enqueue(int(sys.argv[2]), int(sys.argv[3])))
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "work":
        asyncio.run(work(*(int(a) for a in sys.argv[2:])))
    else:
        sys.exit(__doc__)
