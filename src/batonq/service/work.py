"""Worker endpoints (ring 2): enqueue, claim, heartbeat, submit, fail, release."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Annotated

from annotated_types import Len
from fastapi import APIRouter, Header, Request

from batonq import models
from batonq import schemas as s
from batonq.access import Access, queue_of, visible_task
from batonq.errors import TaskNotFound
from batonq.limits import MAX_LIST_ITEMS, MAX_QUEUES_PER_LIST
from batonq.models import task_ref
from batonq.service.auth import Key
from batonq.service.body import JsonRoute
from batonq.service.problems import ERROR_RESPONSES, ApiError
from batonq.service.state import client_of, metrics_of, new_queues, open_per_key

router = APIRouter(prefix="/v1", tags=["work"], responses=ERROR_RESPONSES, route_class=JsonRoute)


async def lease_tokens(request: Request, access: Access, bodies: Sequence[s.LeaseRef]) -> list[str]:
    """Each write's lease token: the one it sent, or the one its ``task_id``
    and ``fencing_token`` name for this key. A lease another key claimed
    gets a token the engine refuses as forged; a task outside the key's
    scopes does not exist."""
    named = [(b.task_id, b.fencing_token) for b in bodies if isinstance(b, s.ByFence)]
    found = iter(await client_of(request).lease_tokens_for_key(named, access.key_id) if named else [])
    tokens = []
    for b in bodies:
        if isinstance(b, s.ByToken):
            access.check_token(b.lease_token)
            tokens.append(b.lease_token)
            continue
        token = next(found)
        if not access.covers(queue_of(token)):
            ref = models.task_id(token.split("/")[1])
            raise TaskNotFound(f"task t_{ref} not found", task_id=ref)
        tokens.append(token)
    return tokens


@router.post(
    "/enqueue",
    response_model=s.EnqueueOut | s.EnqueueManyOut,
    summary="Enqueue one task (an object) or many (a list)",
)
async def enqueue(
    request: Request,
    body: s.EnqueueIn | list[s.EnqueueIn],
    access: Key,
    idempotency_key: Annotated[str | None, Header(max_length=512)] = None,
) -> s.EnqueueOut | s.EnqueueManyOut:
    """The same `idempotency_key` (field, or `Idempotency-Key` header for a single
    task) in the same queue returns the existing task with `created: false`.
    A list is enqueued in one transaction: all of it or none."""
    client = client_of(request)
    items = body if isinstance(body, list) else [body]
    for item in items:
        access.check_queue(item.queue)
    # A parent the key cannot see does not exist for it: refused like an
    # unknown id, before anything is written.
    for parent_ref in {item.parent for item in items if item.parent is not None}:
        await visible_task(client, access, parent_ref)
    queues = len({item.queue for item in items})
    if queues > MAX_QUEUES_PER_LIST:
        message = f"a list that names {queues} queues: send at most {MAX_QUEUES_PER_LIST} per request"
        raise ApiError(413, "too_many_queues", message)
    await new_queues(request).check(access, {item.queue for item in items})
    if not isinstance(body, list):
        created = await client.enqueue(
            body.queue, body.payload, priority=body.priority, delay_s=body.delay_s,
            max_attempts=body.max_attempts, idempotency_key=body.idempotency_key or idempotency_key,
            held=body.held, parent=body.parent, debounce_key=body.debounce_key, debounce_s=body.debounce_s,
            max_wait_s=body.max_wait_s, keep=body.keep, group=body.group,
        )  # fmt: skip
        return s.EnqueueOut.of(created)
    if any(item.debounce_key is not None or item.debounce_s is not None for item in items):
        raise ApiError(400, "invalid_argument", "debounce applies to one task: send an object, not a list")
    groups: dict[tuple[str, int | None, bool, int | str | None], list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        groups[(item.queue, item.max_attempts, item.held, item.parent)].append(index)
    answers: list[s.EnqueueOut | None] = [None] * len(items)
    async with client.transaction() as conn:
        for (queue, max_attempts, held, parent), indexes in groups.items():
            part = [items[i] for i in indexes]
            done = await client.enqueue_many(
                queue, [i.payload for i in part], idempotency_keys=[i.idempotency_key for i in part],
                priorities=[i.priority for i in part], delays_s=[i.delay_s for i in part],
                groups=[i.group for i in part], max_attempts=max_attempts, held=held, parent=parent,
                conn=conn,
            )  # fmt: skip
            for index, answer in zip(indexes, done, strict=True):
                answers[index] = s.EnqueueOut.of(answer)
    return s.EnqueueManyOut(tasks=[a for a in answers if a is not None])


@router.post(
    "/claim",
    response_model=s.ClaimedTask | s.NoTask | s.ClaimOut,
    summary="Claim a task (or, with max_tasks over 1, a list of them) under a lease",
)
async def claim(
    request: Request, body: s.ClaimIn, access: Key
) -> s.ClaimedTask | s.NoTask | s.ClaimOut:
    """Without `max_tasks` (or with 1) the reply is the task itself: `task_id`,
    `fencing_token`, `lease_expires_in_s`, `row` (its input), then
    `lease_token`, `attempt` and the rest; all four are null when there was
    none. With `max_tasks` over 1 it is `{"tasks": [...]}`, each task in
    that shape (`[]` when there was none). Every write about a task presents
    its `lease_token`, or its `task_id` and `fencing_token` from this key.
    With `wait_s`, an empty queue is long-polled."""
    access.check_queue(body.queue)
    if body.max_tasks is not None and body.max_tasks > MAX_LIST_ITEMS:
        message = f"max_tasks {body.max_tasks}: claim at most {MAX_LIST_ITEMS} tasks per request"
        raise ApiError(413, "too_many_items", message)
    release = open_per_key(request).hold(access.key_id) if body.wait_s > 0 else None
    try:
        leases = await client_of(request).claim(
            body.queue, max_tasks=body.max_tasks or 1, lease_s=body.lease_s, wait_s=body.wait_s,
            worker=body.worker or f"key-{access.key_id}", key_id=access.key_id,
        )  # fmt: skip
    finally:
        if release is not None:
            release()
    metrics_of(request).claims.labels(body.queue).inc(len(leases))
    if body.max_tasks is None or body.max_tasks == 1:
        return s.ClaimedTask.of(leases[0]) if leases else s.NO_TASK
    return s.ClaimOut(tasks=[s.ClaimedTask.of(lease) for lease in leases])


@router.post(
    "/heartbeat",
    response_model=s.HeartbeatOut,
    responses={409: {"model": s.ErrorOut, "description": "lease no longer held"}},
)
async def heartbeat(request: Request, body: s.HeartbeatIn, access: Key) -> s.HeartbeatOut:
    """Extend the lease by `lease_s` (default: the claim's) from now; optionally set `stage`."""
    [token] = await lease_tokens(request, access, [body])
    with metrics_of(request).refusals(queue_of(token)):
        beat = await client_of(request).heartbeat(token, lease_s=body.lease_s, stage=body.stage)
    assert beat.lease_expires_in_s is not None and beat.lease_expires_at is not None
    return s.HeartbeatOut(
        task_id=task_ref(beat.task_id),
        lease_expires_in_s=beat.lease_expires_in_s,
        lease_expires_at=beat.lease_expires_at,
    )


@router.post(
    "/submit",
    response_model=s.SubmitOut | s.SubmitManyOut,
    summary="Complete a leased task with its result (an object), or many (a list)",
    responses={
        409: {"model": s.ErrorOut, "description": "lease no longer held; the error says the task's state"}
    },
)
async def submit(
    request: Request,
    body: s.SubmitIn | Annotated[list[s.SubmitIn], Len(1, MAX_LIST_ITEMS)],
    access: Key,
) -> s.SubmitOut | s.SubmitManyOut:
    """Name the lease by `lease_token`, or by `task_id` and `fencing_token`
    (accepted from the key that claimed it). A repeat of an accepted submit
    returns the first outcome with `replayed: true`.

    A list (up to 1,000) is submitted in one round trip and answers
    `{"results": [...]}` in order, each with its `outcome`: a refused item
    (`lease_lost`, `finished`) does not fail the others, nor the request."""
    client, metrics = client_of(request), metrics_of(request)
    if isinstance(body, list):
        tokens = await lease_tokens(request, access, body)
        answers = await client.complete_many(
            [(token, item.result) for token, item in zip(tokens, body, strict=True)]
        )
        for answer in answers:
            if answer.accepted:
                metrics.completions.labels(answer.queue, "replayed" if answer.replayed else "accepted").inc()
            else:
                metrics.refused.labels(answer.queue).inc()
        return s.SubmitManyOut(results=[s.SubmitResultOut.of(answer) for answer in answers])
    [token] = await lease_tokens(request, access, [body])
    queue = queue_of(token)
    with metrics.refusals(queue):
        done = await client.complete(token, body.result)
    metrics.completions.labels(queue, "replayed" if done.replayed else "accepted").inc()
    return s.SubmitOut.of(done)


@router.post(
    "/fail",
    response_model=s.SubmitOut,
    responses={409: {"model": s.ErrorOut, "description": "lease no longer held"}},
)
async def fail(request: Request, body: s.FailIn, access: Key) -> s.SubmitOut:
    """Retry after `retry_delay_s`, or after the queue's backoff when omitted;
    `requeue: false` makes the task dead now."""
    [token] = await lease_tokens(request, access, [body])
    with metrics_of(request).refusals(queue_of(token)):
        failed = await client_of(request).fail(
            token, body.error, retry_delay_s=body.retry_delay_s, requeue=body.requeue
        )
    return s.SubmitOut.of(failed)


@router.post(
    "/release",
    response_model=s.SubmitOut,
    responses={409: {"model": s.ErrorOut, "description": "lease no longer held"}},
)
async def release(request: Request, body: s.ReleaseIn, access: Key) -> s.SubmitOut:
    """Give a lease back unfinished: the task is claimable at once and the attempt is not counted."""
    [token] = await lease_tokens(request, access, [body])
    with metrics_of(request).refusals(queue_of(token)):
        released = await client_of(request).release_lease(token)
    return s.SubmitOut.of(released)
