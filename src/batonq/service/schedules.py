"""Cron schedules and the settings audit over HTTP. A key sees and changes
the schedules of the queues its scopes cover; adding or removing one is an
admin's (ring 0), pausing and resuming an operator's (ring 1)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request

from batonq import schemas as s
from batonq.access import Access, visible_schedule
from batonq.errors import ScheduleNotFound
from batonq.limits import QUEUE_NAME_PATTERN
from batonq.models import AuditEntry
from batonq.service.admin import actor
from batonq.service.auth import Key
from batonq.service.body import JsonRoute
from batonq.service.problems import ERROR_RESPONSES
from batonq.service.state import client_of

router = APIRouter(prefix="/v1", tags=["schedules"], responses=ERROR_RESPONSES, route_class=JsonRoute)
ScheduleName = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, examples=["nightly-report"])]


@router.get("/schedules", response_model=s.SchedulesOut, summary="Cron schedules of the key's queues")
async def schedules(request: Request, access: Key) -> s.SchedulesOut:
    found = await client_of(request).schedules()
    return s.SchedulesOut(schedules=[s.ScheduleOut.of(f) for f in found if access.covers(f.queue)])


@router.post("/schedules", response_model=s.ScheduleOut, summary="Add (or replace) a cron schedule")
async def add_schedule(request: Request, body: s.ScheduleIn, access: Key) -> s.ScheduleOut:
    """Each tick of `cron`, read in time zone `tz`, enqueues `payload` into
    `queue`, fired once by the leading sweeper. A schedule of the same name is
    replaced, and its next tick is the first from now. A key whose scopes
    are not `*` names schedules within its scopes (`shop:nightly` for
    `shop:*`)."""
    access.check_queue(body.queue)
    client = client_of(request)
    replaced = await client.schedule(body.name)
    access.check_schedule_name(body.name, replaced.queue if replaced is not None else None)
    added = await client.add_schedule(
        body.name, body.cron, body.queue, body.payload, tz=body.tz, missed=body.missed, actor=actor(access)
    )
    return s.ScheduleOut.of(added)


@router.delete("/schedules/{name}", status_code=204, summary="Remove a cron schedule")
async def remove_schedule(request: Request, name: ScheduleName, access: Key) -> None:
    """Tasks it already enqueued stay. 404 if there is no such schedule."""
    await visible_schedule(client_of(request), access, name)
    if not await client_of(request).remove_schedule(name, actor=actor(access)):
        raise ScheduleNotFound(f"schedule {name} does not exist", schedule=name)


@router.post("/schedules/{name}/{action}", response_model=s.ScheduleOut, summary="Pause or resume a schedule")
async def pause_schedule(
    request: Request, name: ScheduleName, action: Literal["pause", "resume"], access: Key
) -> s.ScheduleOut:
    """pause: no tick fires; resume: ticks fire again from the next one (those
    that passed while paused are not fired)."""
    await visible_schedule(client_of(request), access, name)
    client = client_of(request)
    change = client.pause_schedule if action == "pause" else client.resume_schedule
    return s.ScheduleOut.of(await change(name, actor=actor(access)))


def _covered(access: Access, entry: AuditEntry) -> bool:
    """Whether the key covers every queue the entry shows: a schedule moved
    between queues shows both."""
    if entry.kind == "queue":
        return access.covers(entry.name)
    return all(access.covers(str(row.get("queue", ""))) for row in (entry.before, entry.after) if row)


# A key that covers few of the audited queues reads at most this many pages
# of entries per request, and is given a cursor to go on from.
_AUDIT_PAGES_READ = 10


@router.get("/audit", response_model=s.AuditOut, summary="Who changed queue settings and schedules, and when")
async def audit(
    request: Request,
    access: Key,
    kind: Annotated[Literal["queue", "schedule"] | None, Query()] = None,
    name: Annotated[str | None, Query(pattern=QUEUE_NAME_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    before_id: Annotated[int | None, Query(ge=1, le=s.MAX_ID)] = None,
) -> s.AuditOut:
    """Newest first, of the queues the key covers (a schedule: its queue).
    `next_before_id` pages on (null at the end); `before` is null for a
    creation, `after` for a removal."""
    client = client_of(request)
    shown: list[AuditEntry] = []
    for _ in range(_AUDIT_PAGES_READ):
        found = await client.settings_audit(kind=kind, name=name, limit=limit, before_id=before_id)
        shown += [e for e in found if _covered(access, e)][: limit - len(shown)]
        if len(shown) == limit:
            before_id = shown[-1].id
            break
        if len(found) < limit:
            before_id = None  # the end
            break
        before_id = found[-1].id
    return s.AuditOut(entries=[s.AuditEntryOut.of(e) for e in shown], next_before_id=before_id)
