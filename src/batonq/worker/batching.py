"""Group commit for completions: the results of many jobs go to the
database in one ``complete_many`` call -- one round trip and one commit --
instead of one each."""

from __future__ import annotations

import asyncio
import contextvars
import logging

from batonq import tracing
from batonq.client import AsyncClient
from batonq.models import JSON, Submitted

__all__ = ["Completions"]

log = logging.getLogger("batonq.worker")


class Completions:
    """``await completions.complete(token, result)`` behaves like
    ``client.complete``: the reply, or ``LeaseLost`` for a refused write.

    One batch is in flight at a time; whatever is completed meanwhile waits
    and goes in the next one, so batches grow with the load and an idle
    worker pays no delay.
    """

    def __init__(self, client: AsyncClient, *, max_batch: int = 1000) -> None:
        self._client = client
        self._max_batch = max_batch
        # (lease token, result, the run's trace context, the caller's future)
        self._waiting: list[tuple[str, JSON, JSON, asyncio.Future[Submitted]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def complete(self, lease_token: str, result: JSON) -> Submitted:
        future: asyncio.Future[Submitted] = asyncio.get_running_loop().create_future()
        self._waiting.append((lease_token, result, tracing.current(), future))
        if self._flusher is None or self._flusher.done():
            # In a context of its own: not a child of the first job's span.
            self._flusher = asyncio.create_task(
                self._flush(), name="batonq-completions", context=contextvars.Context()
            )
        return await future

    async def _flush(self) -> None:
        while self._waiting:
            await asyncio.sleep(0)  # let jobs finishing in this turn of the loop join
            batch, self._waiting = self._waiting[: self._max_batch], self._waiting[self._max_batch :]
            try:
                replies = await self._client.complete_many(
                    [(token, result) for token, result, _, _ in batch],
                    trace_contexts=[trace for _, _, trace, _ in batch],
                )
            except Exception:
                # One bad item (say, an oversized result) refuses the whole
                # call: send them one by one, so each job gets its own answer.
                await asyncio.gather(*(self._one(*item) for item in batch))
                continue
            for (_, _, _, future), reply in zip(batch, replies, strict=True):
                if future.done():
                    continue
                try:
                    future.set_result(reply.or_raise())
                except Exception as refused:
                    future.set_exception(refused)

    async def _one(self, token: str, result: JSON, trace: JSON, future: asyncio.Future[Submitted]) -> None:
        try:
            reply = await self._client.complete(token, result, trace_context=trace)
        except Exception as error:
            if not future.done():
                future.set_exception(error)
        else:
            if not future.done():
                future.set_result(reply)
