"""Operator (ring 1) and admin (ring 0) endpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Request

from batonq import schemas as s
from batonq.access import Access, visible_task
from batonq.limits import QUEUE_NAME_PATTERN
from batonq.rings import ADMIN, OPERATOR
from batonq.service.auth import require
from batonq.service.body import JsonRoute
from batonq.service.problems import ERROR_RESPONSES, ApiError
from batonq.service.reads import TaskId
from batonq.service.state import client_of


def actor(access: Access) -> str:
    """Who a change is audited as: the API key."""
    return f"key:{access.key_id}"


router = APIRouter(prefix="/v1", tags=["operate"], responses=ERROR_RESPONSES, route_class=JsonRoute)
Operator = Annotated[Access, Depends(require(OPERATOR))]
Admin = Annotated[Access, Depends(require(ADMIN))]
KeyId = Annotated[int, Path(ge=1, le=s.MAX_ID)]
QueuePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, examples=["shop:tasks"])]


@router.post(
    "/tasks/{task_id}/{action}", response_model=s.TaskOut, summary="retry, cancel, hold or release a task"
)
async def act(
    request: Request,
    task_id: TaskId,
    action: Literal["retry", "cancel", "hold", "release"],
    access: Operator,
) -> s.TaskOut:
    """retry: a dead or cancelled task runs again; cancel: an unfinished task
    ends; hold: a pending task is kept back; release: a held task is claimable."""
    client = client_of(request)
    task = await visible_task(client, access, task_id)
    operation = {
        "retry": client.retry,
        "cancel": client.cancel,
        "hold": client.hold,
        "release": client.release,
    }
    return s.TaskOut.of(await operation[action](task.id))


@router.patch(
    "/queues/{queue}", response_model=s.QueueSettingsOut, summary="Create a queue or change its settings"
)
async def configure(
    request: Request, queue: QueuePath, body: s.QueueSettingsIn, access: Admin
) -> s.QueueSettingsOut:
    """Fields left out keep their value. `paused: true` stops claims (enqueue still works)."""
    access.check_queue(queue)
    settings = await client_of(request).configure_queue(queue, **body.model_dump(), actor=actor(access))
    return s.QueueSettingsOut.of(settings)


@router.post("/graph/edges", response_model=s.EdgeOut, summary="Add (or replace) an edge of the queue graph")
async def add_edge(request: Request, body: s.EdgeIn, access: Admin) -> s.EdgeOut:
    """An edge that would close a cycle is refused (409 graph_cycle) with the cycle named."""
    access.check_queue(body.from_queue)
    access.check_queue(body.to_queue)
    fields = body.model_dump(exclude={"equals"}, exclude_unset=False)
    if "equals" in body.model_fields_set:
        fields["equals"] = body.equals
    edge = await client_of(request).add_edge(**fields)
    return s.EdgeOut.of(edge)


@router.delete("/graph/edges/{from_queue}/{to_queue}", status_code=204, summary="Remove an edge")
async def remove_edge(request: Request, from_queue: QueuePath, to_queue: QueuePath, access: Admin) -> None:
    """No new batons along it; tasks already handed on go on. 404 if there is no such edge."""
    access.check_queue(from_queue)
    if not await client_of(request).remove_edge(from_queue, to_queue):
        raise ApiError(404, "edge_not_found", f"no edge {from_queue} -> {to_queue}")


@router.get("/keys", response_model=s.KeysOut, summary="API keys (never their secrets)")
async def keys(request: Request, access: Admin) -> s.KeysOut:
    found = await client_of(request).keys()
    return s.KeysOut(keys=[s.KeyOut.of(k) for k in found])


@router.post("/keys", response_model=s.NewKeyOut, status_code=201, summary="Create an API key")
async def create_key(request: Request, body: s.KeyIn, access: Admin) -> s.NewKeyOut:
    """The reply holds the key: it is shown this once."""
    made = await client_of(request).create_key(body.ring, body.queues, body.name)
    return s.NewKeyOut.of(made)


@router.delete("/keys/{key_id}", response_model=s.KeyOut, summary="Revoke an API key")
async def revoke_key(request: Request, key_id: KeyId, access: Admin) -> s.KeyOut:
    revoked = await client_of(request).revoke_key(key_id)
    return s.KeyOut.of(revoked)
