"""The sustained benchmark's peers, each through its own API, run from the
peer's own virtualenv ($BENCH_DSN; counters shared with the benchmark).

python sustained_peer.py SYSTEM setup COUNTERS
python sustained_peer.py SYSTEM produce COUNTERS PENDING BATCH   # keep PENDING waiting, BATCH per call
python sustained_peer.py SYSTEM consume COUNTERS W               # W tasks in flight at most

SYSTEM: pgqueuer (QueueManager, batch W/2, at most W at once),
procrastinate (its worker, concurrency W), pgmq (4 threads reading W/4
messages with a 30 s visibility timeout, then deleting them in one call).
Each runs until the benchmark sets the counters' stop flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from counters import Counters

QUEUE = "bench_sustained"
PGMQ_CONNECTIONS = 4


async def _until_stopped(counters: Counters) -> None:
    while not counters.stopped:
        await asyncio.sleep(0.1)


async def _produce(
    counters: Counters, pending: int, batch: int, send: Callable[[int], Awaitable[None]]
) -> None:
    while not counters.stopped:
        if counters.enqueued - counters.done >= pending:
            await asyncio.sleep(0.002)
            continue
        await send(counters.enqueued)
        counters.enqueued += batch


def _payloads(start: int, batch: int) -> list[dict[str, Any]]:
    return [{"n": i} for i in range(start, start + batch)]


# --------------------------------------------------------------------------
# PgQueuer


async def pgqueuer(role: str, counters: Counters, *args: int) -> None:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(os.environ["BENCH_DSN"])
    if role == "produce":
        pending, batch = args
        queries = Queries(AsyncpgDriver(connection))

        async def send(start: int) -> None:
            payloads = [json.dumps(p).encode() for p in _payloads(start, batch)]
            await queries.enqueue([QUEUE] * batch, payloads, [0] * batch)

        await _produce(counters, pending, batch, send)
        return
    (workers,) = args
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(QUEUE)
    async def noop(job: Job) -> None:
        counters.done += 1

    async def stop() -> None:
        await _until_stopped(counters)
        pgq.shutdown.set()

    stopper = asyncio.create_task(stop())
    await pgq.run(batch_size=max(1, workers // 2), max_concurrent_tasks=max(2, workers))
    await stopper


# --------------------------------------------------------------------------
# Procrastinate


async def procrastinate(role: str, counters: Counters, *args: int) -> None:
    from procrastinate_noop import app

    @app.task(name="sustained_noop", queue=QUEUE)
    async def noop(n: int) -> None:
        counters.done += 1

    async with app.open_async():
        if role == "produce":
            pending, batch = args

            async def send(start: int) -> None:
                await noop.batch_defer_async(*_payloads(start, batch))

            await _produce(counters, pending, batch, send)
            return
        (workers,) = args
        worker = asyncio.create_task(
            app.run_worker_async(queues=[QUEUE], concurrency=workers, install_signal_handlers=False)
        )
        await _until_stopped(counters)
        worker.cancel()  # its graceful stop: running jobs finish
        with contextlib.suppress(asyncio.CancelledError):
            await worker


# --------------------------------------------------------------------------
# pgmq


def pgmq(role: str, counters: Counters, *args: int) -> None:
    from pgmq import PGMQueue, install_pgmq_from_sql

    dsn = os.environ["BENCH_DSN"]
    if role == "setup":  # the extension's SQL as the package ships it, installed as plain SQL
        install_pgmq_from_sql(dsn=dsn)
        PGMQueue(conn_string=dsn, pool_size=1, init_extension=False).create_queue(QUEUE)
        return
    queue = PGMQueue(conn_string=dsn, pool_size=PGMQ_CONNECTIONS, init_extension=False)
    if role == "produce":
        pending, batch = args

        async def send(start: int) -> None:
            queue.send_batch(QUEUE, _payloads(start, batch))

        asyncio.run(_produce(counters, pending, batch, send))
        return
    (workers,) = args
    lock = threading.Lock()

    def loop() -> None:
        while not counters.stopped:
            messages = queue.read(QUEUE, vt=30, qty=max(1, workers // PGMQ_CONNECTIONS)) or []
            if not isinstance(messages, list):
                messages = [messages]
            if not messages:
                time.sleep(0.001)
                continue
            queue.delete_batch(QUEUE, [m.msg_id for m in messages])
            with lock:
                counters.done += len(messages)

    threads = [threading.Thread(target=loop) for _ in range(PGMQ_CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[1] not in ("pgqueuer", "procrastinate", "pgmq"):
        sys.exit(__doc__)
    system, role, path, *rest = sys.argv[1:]
    counters = Counters(path)
    args = [int(a) for a in rest]
    if system == "pgmq":
        pgmq(role, counters, *args)
    elif role != "setup":
        asyncio.run(
            pgqueuer(role, counters, *args) if system == "pgqueuer" else procrastinate(role, counters, *args)
        )


if __name__ == "__main__":
    main()
