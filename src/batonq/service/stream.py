"""GET /v1/stream: server-sent events of claimable work, or (claim=true)
of tasks claimed for the subscriber, at most ``credit`` unfinished at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from batonq import schemas as s
from batonq.client import AsyncClient
from batonq.limits import MAX_LEASE_S, MIN_LEASE_S, QUEUE_NAME_PATTERN
from batonq.service.auth import Key
from batonq.service.body import JsonRoute
from batonq.service.problems import ERROR_RESPONSES, UNAVAILABLE, ApiError, unavailable
from batonq.service.state import client_of, open_per_key
from batonq.service.streams import HeldStream, PendingCounts

router = APIRouter(prefix="/v1", tags=["work"], responses=ERROR_RESPONSES, route_class=JsonRoute)
_CREDIT_POLL_S = 0.25
_EVENT_ID = re.compile("[0-9]{1,19}")
READY = ": ready\n\n"
"""The first thing a stream sends: a comment saying the subscription is live."""


def sse(event: str, data: Any, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


async def _announce(
    client: AsyncClient, counts: PendingCounts, queue: str, keepalive_s: float, seq: int
) -> AsyncGenerator[str, None]:
    with counts.watching(queue) as count:
        async with client.watch(queue) as wake:
            # Subscribed: from here on no enqueue goes unannounced.
            yield READY
            woken = True
            while True:
                # Idle, it looks again now and then (a delayed task may have
                # come due): a count shared with the queue's other streams.
                pending = await count.pending(fresh=woken)
                if pending > 0:
                    seq += 1
                    yield sse("available", {"queue": queue, "pending": pending}, seq)
                woken = await wake.wait(keepalive_s)
                if not woken:
                    yield ": keep-alive\n\n"


async def _still_held(client: AsyncClient, outstanding: dict[int, int]) -> None:
    """Forget the tasks the subscriber has finished (or lost): they free credit."""
    for task_id, token in list(outstanding.items()):
        task = await client.task(task_id)
        if task.state != "leased" or task.fencing_token != token:
            del outstanding[task_id]


async def _deliver(
    client: AsyncClient, queue: str, credit: int, lease_s: int | None, key_id: int, keepalive_s: float
) -> AsyncGenerator[str, None]:
    outstanding: dict[int, int] = {}
    idle = 0.0
    yield READY
    while True:
        await _still_held(client, outstanding)
        free = credit - len(outstanding)
        if free <= 0:
            await asyncio.sleep(_CREDIT_POLL_S)
            idle += _CREDIT_POLL_S
            if idle >= keepalive_s:
                idle = 0.0
                yield ": keep-alive\n\n"
            continue
        leases = await client.claim(
            queue, max_tasks=free, lease_s=lease_s, wait_s=min(keepalive_s, 55),
            worker=f"sse-key-{key_id}", key_id=key_id,
        )  # fmt: skip
        if not leases:
            yield ": keep-alive\n\n"
        for lease in leases:
            outstanding[lease.task_id] = lease.fencing_token
            yield sse("task", s.ClaimedTask.of(lease).model_dump(mode="json"), lease.fencing_token)
        idle = 0.0


async def _until_unavailable(events: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """``events``, until the database is unreachable: then an ``error``
    event with the body a request gets then (503 ``unavailable``), and the
    stream ends as any response does."""
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                yield event
        except UNAVAILABLE:
            yield sse("error", unavailable())


def _resumed_after(last_event_id: str | None) -> int:
    """The event number a reconnecting subscriber saw last (0: none)."""
    if not last_event_id:
        return 0
    if not _EVENT_ID.fullmatch(last_event_id):
        message = "Last-Event-ID: send the id of an event this stream sent (up to 19 digits)"
        raise ApiError(400, "invalid_argument", message)
    return int(last_event_id)


@router.get(
    "/stream",
    summary="Server-sent events: claimable work, or tasks claimed for you",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "an event stream"}},
)
async def stream(
    request: Request,
    access: Key,
    queue: Annotated[str, Query(pattern=QUEUE_NAME_PATTERN)],
    claim: bool = False,
    credit: Annotated[int, Query(ge=1, le=100, description="with claim: unfinished tasks at most")] = 1,
    lease_s: Annotated[int | None, Query(ge=MIN_LEASE_S, le=MAX_LEASE_S)] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Without `claim`: an `available` event (`{"queue","pending"}`) whenever the
    queue has claimable tasks. With `claim=true`: `task` events, each a claimed
    task as `/v1/claim` answers one (`task_id`, `fencing_token`,
    `lease_expires_in_s`, `row`, `lease_token`, ...; the event id is its
    fencing token); at most
    `credit` are unfinished at once, the next comes when you submit or fail one.
    The stream opens with a `: ready` comment once it is subscribed (an
    enqueue after it is announced); `: keep-alive` comments keep idle
    connections open. Tasks leased to a
    dropped connection return when their lease runs out. If the database
    becomes unreachable, an `error` event (`{"error": {"code":
    "unavailable", ...}}`) ends the stream: reconnect later. A key may hold a
    limited number of streams and long-poll claims open at once (429 with
    Retry-After past it)."""
    access.check_queue(queue)
    client = client_of(request)
    keepalive_s: float = request.app.state.keepalive_s
    if claim:
        events = _deliver(client, queue, credit, lease_s, access.key_id, keepalive_s)
    else:
        seq = _resumed_after(last_event_id)
        events = _announce(client, request.app.state.pending_counts, queue, keepalive_s, seq)
    release = open_per_key(request).hold(access.key_id)
    return HeldStream(
        _until_unavailable(events),
        release,
        request.app.state.stopping,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
