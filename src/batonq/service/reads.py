"""Read endpoints (ring 3): queues, tasks, runs, graph."""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import APIRouter, Depends, Path, Query, Request

from batonq import operations
from batonq.client import AsyncClient
from batonq.errors import InvalidArgument, TaskNotFound
from batonq.models import QueueStats, Task
from batonq.operations import task_ref
from batonq.rings import OBSERVER, scope_regex
from batonq.service import schemas as s
from batonq.service.auth import Principal, require
from batonq.service.body import JsonRoute
from batonq.service.problems import ERROR_RESPONSES
from batonq.service.state import client_of, reader_of

router = APIRouter(prefix="/v1", tags=["read"], responses=ERROR_RESPONSES, route_class=JsonRoute)
Observer = Annotated[Principal, Depends(require(OBSERVER))]
LINEAGE_LIMIT = 200
QUEUES_PAGE = 1000
"""The most queues /v1/queues answers with at once."""
TaskId = Annotated[str, Path(pattern=s.TASK_ID_PATTERN, examples=["t_5521"])]



class Scoped(Protocol):
    @property
    def queues(self) -> tuple[str, ...]: ...

    def covers(self, queue: str) -> bool: ...


async def queue_page(
    reader: AsyncClient, key: Scoped, after: str | None, limit: int
) -> tuple[list[QueueStats], str | None]:
    """The first ``limit`` queues that ``key`` covers, by name after
    ``after``, and the cursor of the next page (None at the end). Only the
    page's queues are counted (HTTP and MCP)."""
    patterns = None if "*" in key.queues else [scope_regex(p) for p in key.queues]
    shown: list[QueueStats] = []
    while True:
        stats = await reader.queues(after=after, limit=limit, patterns=patterns)
        shown += [q for q in stats if key.covers(q.queue)][: limit - len(shown)]
        if len(stats) < limit or len(shown) == limit:
            break
        after = stats[-1].queue
    return shown, shown[-1].queue if len(shown) == limit else None


async def visible_task(client: AsyncClient, principal: Scoped, task_id: int | str) -> Task:
    """The task, if the key covers its queue; otherwise it does not exist:
    the same 404, word for word, as for an id nobody has."""
    ref = operations.task_id(task_id)
    try:
        task = await client.task(ref)
    except TaskNotFound:
        task = None
    if task is None or not principal.covers(task.queue):
        raise TaskNotFound(f"task t_{ref} not found", task_id=ref)
    return task


@router.get(
    "/queues", response_model=s.QueuesOut, summary="Tasks per state and oldest pending age, per queue"
)
async def queues(
    request: Request,
    principal: Observer,
    limit: Annotated[int, Query(ge=1, le=QUEUES_PAGE)] = QUEUES_PAGE,
    cursor: Annotated[
        str | None, Query(pattern=s.QUEUE_PATTERN, description="next_cursor of the previous page")
    ] = None,
) -> s.QueuesOut:
    """The key's queues by name, a page at a time: only the page's queues
    are counted."""
    shown, next_cursor = await queue_page(reader_of(request), principal, cursor, limit)
    return s.QueuesOut(
        queues=[s.QueueStatsOut.model_validate(q, from_attributes=True) for q in shown],
        next_cursor=next_cursor,
    )


@router.get("/tasks", response_model=s.TaskListOut, summary="The newest tasks of a queue")
async def tasks(
    request: Request,
    principal: Observer,
    queue: Annotated[str, Query(pattern=s.QUEUE_PATTERN)],
    state: s.State | None = None,
    status: Annotated[s.State | None, Query(description="the same as state")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[
        str | None, Query(pattern=s.TASK_ID_PATTERN, description="next_cursor of the previous page")
    ] = None,
) -> s.TaskListOut:
    principal.check_queue(queue)
    if state is not None and status is not None:
        raise InvalidArgument("give state or status, not both")
    before = None
    if cursor is not None:
        try:
            before = operations.task_id(cursor)
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
async def task(request: Request, task_id: TaskId, principal: Observer) -> s.TaskDetailOut:
    """`set_aside` lists the writes refused about this task (a late submit
    from an older lease, a forged token): kind, fencing token, when, and the
    worker and key that held that token's lease."""
    client = reader_of(request)
    try:
        found = await visible_task(client, principal, task_id)
    except TaskNotFound:
        if client is client_of(request):
            raise
        # A task enqueued a moment ago may not have reached the replica yet.
        client = client_of(request)
        found = await visible_task(client, principal, task_id)
    run = await client.run_status(found.root_id)
    lineage = await client.run_tasks(found.root_id)
    set_aside = await client.set_aside_writes([found.id])
    return s.TaskDetailOut(
        **s.TaskOut.of(found).model_dump(),
        run=s.RunOut.of(run, principal.covers),
        lineage=[s.TaskOut.of(t) for t in lineage[:LINEAGE_LIMIT] if principal.covers(t.queue)],
        set_aside=[s.SetAsideOut.of(w) for w in set_aside],
    )


@router.get("/runs/{root_id}", response_model=s.RunOut, summary="A run's status, derived from its tasks")
async def run(request: Request, root_id: TaskId, principal: Observer) -> s.RunOut:
    client = client_of(request)
    root = await visible_task(client, principal, root_id)
    return s.RunOut.of(await client.run_status(root.root_id), principal.covers)


@router.get("/graph", response_model=s.GraphOut, summary="The queue graph's edges")
async def graph(request: Request, principal: Observer) -> s.GraphOut:
    edges = await client_of(request).edges()
    return s.GraphOut(
        edges=[
            s.EdgeOut.model_validate(e, from_attributes=True)
            for e in edges
            if principal.covers(e.from_queue) or principal.covers(e.to_queue)
        ]
    )
