"""Operator (ring 1) and admin (ring 0) endpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request

from batonq import schemas as s
from batonq.access import Access, managed_keys, visible_key, visible_task
from batonq.limits import QUEUE_NAME_PATTERN
from batonq.service.auth import Key
from batonq.service.body import JsonRoute
from batonq.service.problems import ERROR_RESPONSES, ApiError
from batonq.service.reads import TaskId
from batonq.service.state import client_of


def actor(access: Access) -> str:
    """Who a change is audited as: the API key."""
    return f"key:{access.key_id}"


router = APIRouter(prefix="/v1", tags=["operate"], responses=ERROR_RESPONSES, route_class=JsonRoute)
KeyId = Annotated[int, Path(ge=1, le=s.MAX_ID)]
QueuePath = Annotated[str, Path(pattern=QUEUE_NAME_PATTERN, examples=["shop:tasks"])]


@router.post(
    "/tasks/{task_id}/{action}", response_model=s.TaskOut, summary="retry, cancel, hold or release a task"
)
async def act(
    request: Request,
    task_id: TaskId,
    action: Literal["retry", "cancel", "hold", "release"],
    access: Key,
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
    request: Request, queue: QueuePath, body: s.QueueSettingsIn, access: Key
) -> s.QueueSettingsOut:
    """Fields left out keep their value. `paused: true` stops claims (enqueue still works)."""
    access.check_queue(queue)
    settings = await client_of(request).configure_queue(queue, **body.model_dump(), actor=actor(access))
    return s.QueueSettingsOut.of(settings)


@router.post("/graph/edges", response_model=s.EdgeOut, summary="Add (or replace) an edge of the queue graph")
async def add_edge(request: Request, body: s.EdgeIn, access: Key) -> s.EdgeOut:
    """An edge that would close a cycle is refused (409 graph_cycle) with the cycle named."""
    access.check_edge(body.from_queue, body.to_queue)
    fields = body.model_dump(exclude={"equals"}, exclude_unset=False)
    if "equals" in body.model_fields_set:
        fields["equals"] = body.equals
    edge = await client_of(request).add_edge(**fields)
    return s.EdgeOut.of(edge)


@router.delete("/graph/edges/{from_queue}/{to_queue}", status_code=204, summary="Remove an edge")
async def remove_edge(request: Request, from_queue: QueuePath, to_queue: QueuePath, access: Key) -> None:
    """No new batons along it; tasks already handed on go on. 404 if there is no such edge.
    The key must cover both queues, as to add it."""
    access.check_edge(from_queue, to_queue)
    if not await client_of(request).remove_edge(from_queue, to_queue):
        raise ApiError(404, "edge_not_found", f"no edge {from_queue} -> {to_queue}")


@router.get("/keys", response_model=s.KeysOut, summary="API keys (never their secrets)")
async def keys(request: Request, access: Key) -> s.KeysOut:
    """The keys this key manages: of its ring or weaker, with scopes inside its own."""
    found = await managed_keys(client_of(request), access)
    return s.KeysOut(keys=[s.KeyOut.of(k) for k in found])


@router.post("/keys", response_model=s.NewKeyOut, status_code=201, summary="Create an API key")
async def create_key(request: Request, body: s.KeyIn, access: Key) -> s.NewKeyOut:
    """The reply holds the key: it is shown this once. A key makes keys of
    its ring or weaker, whose scopes lie inside its own (403 otherwise)."""
    access.check_manages(body.ring, body.queues)
    made = await client_of(request).create_key(body.ring, body.queues, body.name)
    return s.NewKeyOut.of(made)


@router.delete("/keys/{key_id}", response_model=s.KeyOut, summary="Revoke an API key")
async def revoke_key(request: Request, key_id: KeyId, access: Key) -> s.KeyOut:
    """A key it does not manage is 404, as one that does not exist."""
    await visible_key(client_of(request), access, key_id)
    revoked = await client_of(request).revoke_key(key_id)
    return s.KeyOut.of(revoked)
