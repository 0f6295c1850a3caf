"""An async call whose caller is cancelled (an HTTP client that went away,
a worker stopping) still runs to its end on the server, and the pool's next
calls are not hit by a cancel request meant for the first."""

from __future__ import annotations

import asyncio
import contextlib

from tests.worker.support import eventually_async

import batonq

Q = "cancel:me"
CALLS = 30


async def test_a_cancelled_caller_does_not_cut_its_call_short(aclient: batonq.AsyncClient) -> None:
    for i in range(CALLS):
        call = asyncio.create_task(aclient.enqueue(Q, {"i": i}, idempotency_key=f"k{i}"))
        for _ in range(3):  # far enough for the query to be on its way
            await asyncio.sleep(0)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        # The next calls go through: no late cancel lands on them.
        await aclient.queues(Q)
        await aclient.tasks(Q, limit=1)

    async def landed() -> list[str] | None:
        keys = sorted(task.idempotency_key or "" for task in await aclient.tasks(Q, limit=100))
        return keys if len(keys) == CALLS else None

    keys = await eventually_async(landed, timeout=10, what=f"all {CALLS} cancelled enqueues landed")
    assert keys == sorted(f"k{i}" for i in range(CALLS))
