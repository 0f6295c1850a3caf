"""Read endpoints (ring 3): queues, tasks, runs, graph."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from batonq import models
from batonq import schemas as s
from batonq.access import queue_page, visible_task
from batonq.errors import InvalidArgument, QueueNotFound, TaskNotFound
from batonq.limits import MAX_PAGE, QUEUE_NAME_PATTERN
from batonq.models import task_ref
from batonq.service.auth import Key
from batonq.service.body import JsonRoute
from batonq.service.problems import ERROR_RESPONSES
from batonq.service.state import client_of, reader_of

router = APIRouter(prefix="/v1", tags=["read"], responses=ERROR_RESPONSES, route_class=JsonRoute)
LINEAGE_LIMIT = 200
QUEUES_PAGE = MAX_PAGE
"""The most queues /v1/queues answers with at once."""
TaskId = Annotated[str, Path(pattern=s.TASK_ID_PATTERN, examples=["t_5521"])]


@router.get(
    "/queues", response_model=s.QueuesOut, summary="Tasks per state and oldest pending age, per queue"
)
async def queues(
    request: Request,
    access: Key,
    limit: Annotated[int, Query(ge=1, le=QUEUES_PAGE)] = QUEUES_PAGE,
    cursor: Annotated[
        str | None, Query(pattern=QUEUE_NAME_PATTERN, description="next_cursor of the previous page")
    ] = None,
) -> s.QueuesOut:
    """The key's queues by name, a page at a time: only the page's queues
    are counted."""
    shown, next_cursor = await queue_page(reader_of(request), access, cursor, limit)
    return s.QueuesOut(
        queues=[s.QueueStatsOut.of(q) for q in shown],
        next_cursor=next_cursor,
    )


@router.get("/queues/{queue}/settings", response_model=s.QueueSettingsOut, summary="A queue's settings")
async def queue_settings(
    request: Request,
    queue: Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, examples=["shop:tasks"])],
    access: Key,
) -> s.QueueSettingsOut:
    """paused, lease, attempts, backoff, retention and body limit; change
    them with `PATCH /v1/queues/{queue}` (admin)."""
    access.check_queue(queue)
    found = await reader_of(request).queue_configs([queue])
    if not found:
        raise QueueNotFound(f"queue {queue} does not exist", queue=queue)
    return s.QueueSettingsOut.of(found[0])


@router.get("/tasks", response_model=s.TaskListOut, summary="The newest tasks of a queue")
async def tasks(
    request: Request,
    access: Key,
    queue: Annotated[str, Query(pattern=QUEUE_NAME_PATTERN)],
    state: Annotated[
        s.StateFilter | None, Query(description="a state, or scheduled: the pending not due yet")
    ] = None,
    status: Annotated[s.StateFilter | None, Query(description="the same as state")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[
        str | None, Query(pattern=s.TASK_ID_PATTERN, description="next_cursor of the previous page")
    ] = None,
) -> s.TaskListOut:
    access.check_queue(queue)
    if state is not None and status is not None:
        raise InvalidArgument("give state or status, not both")
    before = None
    if cursor is not None:
        try:
            before = models.task_id(cursor)
        except InvalidArgument as error:
            raise InvalidArgument(f"cursor: {error.message}") from None
    found = await reader_of(request).tasks(queue, state=state or status, limit=limit, before_id=before)
    next_cursor = task_ref(found[-1].id) if len(found) == limit else None
    return s.TaskListOut(tasks=[s.TaskOut.of(t) for t in found], next_cursor=next_cursor)


@router.get(
    "/tasks/{task_id}",
    response_model=s.TaskDetailOut,
    summary="One task, with attempts, lineage and refused writes",
)
async def task(request: Request, task_id: TaskId, access: Key) -> s.TaskDetailOut:
    """`set_aside` lists the writes refused about this task (a late submit
    from an older lease, a forged token): kind, fencing token, when, and the
    worker and key that held that token's lease."""
    client = reader_of(request)
    try:
        found = await visible_task(client, access, task_id)
    except TaskNotFound:
        if client is client_of(request):
            raise
        # A task enqueued a moment ago may not have reached the replica yet.
        client = client_of(request)
        found = await visible_task(client, access, task_id)
    run = await client.run_status(found.root_id)
    lineage = await client.run_tasks(found.root_id, LINEAGE_LIMIT)  # a long run is not read whole
    set_aside = await client.set_aside_writes([found.id])
    return s.TaskDetailOut(
        **s.TaskOut.of(found).model_dump(),
        run=s.RunOut.of(run, access.covers),
        lineage=[s.TaskOut.of(t) for t in lineage if access.covers(t.queue)],
        set_aside=[s.SetAsideOut.of(w) for w in set_aside],
    )


@router.get("/runs/{root_id}", response_model=s.RunOut, summary="A run's status, derived from its tasks")
async def run(request: Request, root_id: TaskId, access: Key) -> s.RunOut:
    client = client_of(request)
    root = await visible_task(client, access, root_id)
    return s.RunOut.of(await client.run_status(root.root_id), access.covers)


@router.get("/graph", response_model=s.GraphOut, summary="The queue graph's edges")
async def graph(request: Request, access: Key) -> s.GraphOut:
    edges = await client_of(request).edges()
    return s.GraphOut(
        edges=[
            s.EdgeOut.of(e)
            for e in edges
            if access.covers(e.from_queue) or access.covers(e.to_queue)
        ]
    )
