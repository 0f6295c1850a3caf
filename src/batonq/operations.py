"""The engine's operations as pure data: for each, the SQL that calls its
function, the parameters, and how to read the rows back.

The async and the sync client both execute these, so the logic lives once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from psycopg.types.json import Jsonb

from batonq import schedules
from batonq.errors import InvalidArgument
from batonq.json_values import JsonText
from batonq.limits import MAX_WAIT_S
from batonq.models import (
    JSON,
    MISSING,
    ApiKey,
    AuditEntry,
    Edge,
    Enqueued,
    KeyAuth,
    Lease,
    NewKey,
    QueueConfig,
    QueueStats,
    RunStatus,
    Schedule,
    ScheduleFiring,
    Scorecard,
    SessionAuth,
    SetAsideWrite,
    Submitted,
    Task,
    Throughput,
    task_id,
)
from batonq.rings import scope_regex

T = TypeVar("T")
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One round trip: ``sql`` with ``params``, read back by ``parse``."""

    sql: str
    params: tuple[Any, ...]
    parse: Callable[[Rows], T]


def _one(cls: Callable[..., T]) -> Callable[[Rows], T]:
    return lambda rows: cls(*rows[0])


def _maybe(cls: Callable[..., T]) -> Callable[[Rows], T | None]:
    return lambda rows: cls(*rows[0]) if rows else None


def _all(cls: Callable[..., T]) -> Callable[[Rows], list[T]]:
    return lambda rows: [cls(*row) for row in rows]


def _columns(cls: type) -> str:
    """A dataclass's fields as a select list: its rows are read by name, so
    the engine's column order is free."""
    return ", ".join(f'"{f.name}"' for f in dataclasses.fields(cls))


_TASK = _columns(Task)
_QUEUE_STATS = _columns(QueueStats)
_QUEUE_CONFIG = _columns(QueueConfig)


def _submitted(rows: Rows) -> Submitted:
    """Read a write's reply; a refused write raises (after its transaction
    committed the refusal to the ledger)."""
    return Submitted(*rows[0]).or_raise()


def _json(value: JSON) -> Jsonb:
    if isinstance(value, JsonText):
        return Jsonb(value, dumps=str)
    return Jsonb(value)


def _json_or_null(value: JSON) -> Jsonb | None:
    """SQL NULL for None (a trace context left out), not JSON null."""
    return None if value is None else _json(value)


def _texts(**values: str | None) -> None:
    """Refuse a value that is not text where the engine takes text: the
    database would read a list as an array's text form (``'{a,b}'``)."""
    for name, value in values.items():
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a string (got {type(value).__name__})")


def enqueue(
    queue: str,
    payload: JSON,
    *,
    priority: int = 0,
    delay_s: float = 0.0,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    held: bool = False,
    parent: int | str | None = None,
    debounce_key: str | None = None,
    debounce_s: float | None = None,
    max_wait_s: float | None = None,
    keep: str = "last",
    group: str | None = None,
    dedupe_key: str | None = None,
    trace_context: JSON = None,
) -> Call[Enqueued]:
    """``trace_context``: the enqueuer's W3C trace context (batonq.tracing)."""
    trace = _json_or_null(trace_context)
    _texts(group=group, idempotency_key=idempotency_key, debounce_key=debounce_key, dedupe_key=dedupe_key)
    if dedupe_key is not None:
        if idempotency_key is not None or debounce_key is not None or held or parent is not None:
            raise InvalidArgument("dedupe_key takes no idempotency_key, debounce_key, held or parent")
        return Call(
            "SELECT * FROM batonq.enqueue_deduped(%s, %s, %s, %s, %s, %s, %s, %s)",
            (queue, _json(payload), dedupe_key, priority, float(delay_s), max_attempts, group, trace),
            _one(Enqueued),
        )
    if debounce_key is not None or debounce_s is not None:
        if debounce_key is None or debounce_s is None:
            raise InvalidArgument("debounce needs both debounce_key and debounce_s")
        if delay_s or idempotency_key is not None or held or parent is not None:
            raise InvalidArgument("a debounced enqueue takes no delay_s, idempotency_key, held or parent")
        return Call(
            "SELECT * FROM batonq.enqueue_debounced(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (queue, debounce_key, _json(payload), float(debounce_s),
             None if max_wait_s is None else float(max_wait_s), keep, priority, max_attempts, group),
            _one(Enqueued),
        )  # fmt: skip
    if max_wait_s is not None or keep != "last":
        raise InvalidArgument("max_wait_s and keep need debounce_key and debounce_s")
    return Call(
        "SELECT * FROM batonq.enqueue(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            queue,
            _json(payload),
            priority,
            float(delay_s),
            max_attempts,
            idempotency_key,
            held,
            None if parent is None else task_id(parent),
            group,
            trace,
        ),
        _one(Enqueued),
    )


def enqueue_many(
    queue: str,
    payloads: Sequence[JSON],
    *,
    idempotency_keys: Sequence[str | None] | None = None,
    priorities: Sequence[int] | None = None,
    delays_s: Sequence[float] | None = None,
    max_attempts: int | None = None,
    held: bool = False,
    parent: int | str | None = None,
    groups: Sequence[str | None] | None = None,
    group: str | None = None,
    trace_context: JSON = None,
) -> Call[list[Enqueued]]:
    """``groups`` runs parallel to ``payloads``; ``group`` puts them all in
    one; ``trace_context``, the enqueuer's, goes with every task."""
    _texts(group=group)
    for each in groups or ():
        _texts(group=each)
    if group is not None:
        if groups is not None:
            raise InvalidArgument("give group or groups, not both")
        groups = [group] * len(payloads)
    return Call(
        "SELECT task_id, queue, created, state, run_at"
        " FROM batonq.enqueue_many(%s, %b::jsonb[], %s::text[], %s::integer[],"
        " %s::double precision[], %s, %s, %s, %s::text[], %s)",
        (
            queue,
            [_json(p) for p in payloads],
            None if idempotency_keys is None else list(idempotency_keys),
            None if priorities is None else list(priorities),
            None if delays_s is None else [float(d) for d in delays_s],
            max_attempts,
            held,
            None if parent is None else task_id(parent),
            None if groups is None else list(groups),
            _json_or_null(trace_context),
        ),
        _all(Enqueued),
    )


_CLAIM = "batonq.claim(%s, %s, %s, %s, %s)"  # queue, worker, max_tasks, lease_s, key_id


def claim(
    queue: str,
    *,
    worker: str | None = None,
    max_tasks: int = 1,
    lease_s: int | None = None,
    key_id: int | None = None,
) -> Call[list[Lease]]:
    return Call(
        f"SELECT * FROM {_CLAIM}",
        (queue, worker, max_tasks, lease_s, key_id),
        _all(Lease),
    )


def claim_or_rate_wait(
    queue: str,
    *,
    worker: str | None = None,
    max_tasks: int = 1,
    lease_s: int | None = None,
    key_id: int | None = None,
) -> Call[tuple[list[Lease], float]]:
    """A long-poll's look: ``claim``, and when it took nothing, in the same
    round trip, the seconds until the queue's rate limits have a token again
    (the queue's, or the soonest of the groups out of tokens with tasks due:
    ``batonq.rate_wait_s``; 0 when no rate limit held it back)."""

    def parse(rows: Rows) -> tuple[list[Lease], float]:
        if len(rows) == 1 and rows[0][0] is None:
            return [], float(rows[0][-1])
        return [Lease(*row[:-1]) for row in rows], 0.0

    return Call(
        f"WITH c AS (SELECT * FROM {_CLAIM})"
        " SELECT c.*, NULL::double precision FROM c"
        " UNION ALL SELECT (NULL::batonq.lease).*, batonq.rate_wait_s(%s) WHERE NOT EXISTS (SELECT FROM c)",
        (queue, worker, max_tasks, lease_s, key_id, queue),
        parse,
    )


def lease_tokens_for_key(leases: Sequence[tuple[int | str, int]], key_id: int) -> Call[list[str]]:
    """One lease token per ``(task id, fencing token)``, in order."""
    return Call(
        "SELECT batonq.lease_token_for_key(u.id, u.fence, %s)"
        " FROM unnest(%s::bigint[], %s::bigint[]) WITH ORDINALITY AS u(id, fence, ord) ORDER BY u.ord",
        (key_id, [task_id(t) for t, _ in leases], [fence for _, fence in leases]),
        lambda rows: [row[0] for row in rows],
    )


def rate_wait(queues: Sequence[str]) -> Call[float]:
    """Seconds until the first of ``queues`` held back by a rate limit (its
    own, or its groups') has a token again; 0 when none is held back."""
    return Call(
        "SELECT coalesce(min(w) FILTER (WHERE w > 0), 0)"
        " FROM unnest(%s::text[]) AS q, batonq.rate_wait_s(q) AS w",
        (list(queues),),
        lambda rows: float(rows[0][0]),
    )


def await_work(queue: str, for_s: float) -> Call[datetime]:
    return Call("SELECT batonq.await_work(%s, %s)", (queue, for_s), lambda rows: rows[0][0])


def check_wait(wait_s: float) -> float:
    if not 0 <= wait_s <= MAX_WAIT_S:
        raise InvalidArgument(f"wait_s must be between 0 and {MAX_WAIT_S:g}")
    return float(wait_s)


def queue_of(lease_token: str) -> str:
    """The queue a lease token names first: the writes take it as their first
    argument, by which a sharded deployment routes them (docs/scaling.md)."""
    return lease_token.partition("/")[0]


def heartbeat(lease_token: str, *, lease_s: int | None = None, stage: str | None = None) -> Call[Submitted]:
    return Call(
        "SELECT * FROM batonq.heartbeat_in(%s, %s, %s, %s)",
        (queue_of(lease_token), lease_token, lease_s, stage),
        _submitted,
    )


def complete(lease_token: str, result: JSON = None, *, trace_context: JSON = None) -> Call[Submitted]:
    """``trace_context``: the run's, which the task's batons carry."""
    return Call(
        "SELECT * FROM batonq.complete_in(%s, %s, %s, %s)",
        (queue_of(lease_token), lease_token, _json(result), _json_or_null(trace_context)),
        _submitted,
    )


def complete_many(
    items: Sequence[tuple[str, JSON]], *, trace_contexts: Sequence[JSON] | None = None
) -> Call[list[Submitted]]:
    """Replies in order; refused items come back with their outcome, unraised.
    A batch of one queue (a worker's) calls that queue's complete_many_in.
    ``trace_contexts`` runs parallel to ``items``: each run's context."""
    tokens = [token for token, _ in items]
    queues = {queue_of(token) for token in tokens}
    # %b: arrays in binary, because the text format escapes every element
    # with a regex (about a fifth of a batch-100 claim + complete loop's time).
    # No array at all when no item has a context (no tracing): nothing to unnest.
    traces = [_json_or_null(t) for t in trace_contexts] if trace_contexts and any(trace_contexts) else None
    arrays = (tokens, [_json(result) for _, result in items], traces)
    call, params = (
        ("batonq.complete_many_in(%s, %b::text[], %b::jsonb[], %b::jsonb[])", (queues.pop(), *arrays))
        if len(queues) == 1
        else ("batonq.complete_many(%b::text[], %b::jsonb[], %b::jsonb[])", arrays)
    )
    return Call(
        f"SELECT task_id, queue, outcome, state, fencing_token, current_fencing_token, NULL, NULL"
        f" FROM {call}",
        params,
        _all(Submitted),
    )


def fail(
    lease_token: str,
    error: JSON = None,
    *,
    retry_delay_s: float | None = None,
    requeue: bool = True,
) -> Call[Submitted]:
    return Call(
        "SELECT * FROM batonq.fail_in(%s, %s, %s, %s, %s)",
        (
            queue_of(lease_token),
            lease_token,
            _json(error),
            None if retry_delay_s is None else float(retry_delay_s),
            requeue,
        ),
        _submitted,
    )


def release_lease(lease_token: str) -> Call[Submitted]:
    return Call(
        "SELECT * FROM batonq.release_lease_in(%s, %s)",
        (queue_of(lease_token), lease_token),
        _submitted,
    )


def task(id: int | str) -> Call[Task]:
    return Call(f"SELECT {_TASK} FROM batonq.get_task(%s)", (task_id(id),), _one(Task))


def set_aside_writes(task_ids: Sequence[int | str]) -> Call[list[SetAsideWrite]]:
    return Call(
        "SELECT * FROM batonq.set_aside_writes(%s::bigint[])",
        ([task_id(t) for t in task_ids],),
        _all(SetAsideWrite),
    )


def tasks(
    queue: str, *, state: str | None = None, limit: int = 50, before_id: int | str | None = None
) -> Call[list[Task]]:
    return Call(
        f"SELECT {_TASK} FROM batonq.list_tasks(%s, %s, %s, %s)",
        (queue, state, limit, None if before_id is None else task_id(before_id)),
        _all(Task),
    )


def queues(
    queue: str | None = None,
    *,
    after: str | None = None,
    limit: int | None = None,
    patterns: Sequence[str] | None = None,
) -> Call[list[QueueStats]]:
    return Call(
        f"SELECT {_QUEUE_STATS} FROM batonq.queue_stats(%s, %s, %s, %s::text[])",
        (queue, after, limit, None if patterns is None else list(patterns)),
        _all(QueueStats),
    )


def queue_configs(queues: Sequence[str] | None = None) -> Call[list[QueueConfig]]:
    return Call(
        f"SELECT {_QUEUE_CONFIG} FROM batonq.list_queues(%s::text[])",
        (None if queues is None else list(queues),),
        _all(QueueConfig),
    )


def configure_queue(
    queue: str,
    *,
    lease_s: int | None = None,
    max_attempts: int | None = None,
    backoff_base_s: float | None = None,
    backoff_max_s: float | None = None,
    retention_s: int | None = None,
    max_body_bytes: int | None = None,
    paused: bool | None = None,
    max_leased: int | None = None,
    group_max_leased: int | None = None,
    rate_limit: int | None = None,
    rate_period_s: float | None = None,
    group_rate_limit: int | None = None,
    actor: str | None = None,
) -> Call[QueueConfig]:
    return Call(
        f"SELECT {_QUEUE_CONFIG} FROM batonq.configure_queue({', '.join(['%s'] * 14)})",
        (queue, lease_s, max_attempts, backoff_base_s, backoff_max_s, retention_s, max_body_bytes,
         paused, max_leased, group_max_leased, rate_limit,
         None if rate_period_s is None else float(rate_period_s), group_rate_limit, actor),
        _one(QueueConfig),
    )  # fmt: skip


def _operator(action: str) -> Callable[[int | str], Call[Task]]:
    def call(id: int | str) -> Call[Task]:
        return Call(f"SELECT {_TASK} FROM batonq.{action}_task(%s)", (task_id(id),), _one(Task))

    return call


retry = _operator("retry")
cancel = _operator("cancel")
hold = _operator("hold")
release = _operator("release")


def sweep() -> Call[int]:
    return Call("SELECT batonq.sweep()", (), lambda rows: int(rows[0][0]))


def maintain() -> Call[dict[str, int]]:
    return Call("SELECT batonq.maintain()", (), lambda rows: dict(rows[0][0]))


def add_edge(
    from_queue: str,
    to_queue: str,
    *,
    map: str | None = None,
    fan_out: str | None = None,
    when: str | None = None,
    equals: JSON = MISSING,
    present: bool | None = None,
    join: bool = False,
    partial: bool = False,
    priority: int | None = None,
    delay_s: float = 0.0,
) -> Call[Edge]:
    if when is not None and equals is MISSING and present is None:
        present = True
    return Call(
        "SELECT * FROM batonq.add_edge(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            from_queue,
            to_queue,
            map,
            fan_out,
            when,
            None if equals is MISSING else _json(equals),
            present,
            join,
            partial,
            priority,
            float(delay_s),
        ),
        _one(Edge),
    )


def remove_edge(from_queue: str, to_queue: str) -> Call[bool]:
    return Call("SELECT batonq.remove_edge(%s, %s)", (from_queue, to_queue), lambda rows: bool(rows[0][0]))


def edges() -> Call[list[Edge]]:
    return Call("SELECT * FROM batonq.list_edges()", (), _all(Edge))


def run_tasks(root_id: int | str, limit: int | None = None) -> Call[list[Task]]:
    return Call(f"SELECT {_TASK} FROM batonq.run_tasks(%s, %s)", (task_id(root_id), limit), _all(Task))


def run_status(root_id: int | str) -> Call[RunStatus]:
    return Call("SELECT * FROM batonq.run_status(%s)", (task_id(root_id),), _one(RunStatus))


def create_key(ring: int, queues: Sequence[str] = ("*",), name: str = "") -> Call[NewKey]:
    return Call(
        "SELECT * FROM batonq.create_key(%s, %s::text[], %s)", (ring, list(queues), name), _one(NewKey)
    )


def create_first_key() -> Call[NewKey | None]:
    return Call("SELECT * FROM batonq.create_first_key()", (), _maybe(NewKey))


def key_for_auth(key_id: int) -> Call[KeyAuth | None]:
    return Call(
        "SELECT * FROM batonq.key_for_auth(%s)",
        (key_id,),
        lambda rows: KeyAuth(bytes(rows[0][0]), *rows[0][1:]) if rows else None,
    )


def create_session(key_id: int, secret_hash: bytes, token_hash: bytes) -> Call[SessionAuth | None]:
    return Call(
        "SELECT * FROM batonq.create_session(%s, %s, %s)",
        (key_id, secret_hash, token_hash),
        _maybe(SessionAuth),
    )


def session_for_auth(token_hash: bytes) -> Call[SessionAuth | None]:
    return Call("SELECT * FROM batonq.session_for_auth(%s)", (token_hash,), _maybe(SessionAuth))


def end_session(token_hash: bytes) -> Call[bool]:
    return Call("SELECT batonq.end_session(%s)", (token_hash,), lambda rows: bool(rows[0][0]))


def keys() -> Call[list[ApiKey]]:
    return Call("SELECT * FROM batonq.list_keys()", (), _all(ApiKey))


def revoke_key(key_id: int) -> Call[ApiKey]:
    return Call("SELECT * FROM batonq.revoke_key(%s)", (key_id,), _one(ApiKey))


def _scopes(scopes: Sequence[str]) -> list[str]:
    return [scope_regex(pattern) for pattern in scopes]


def queue_page(
    scopes: Sequence[str] = ("*",), *, search: str | None = None, after: str | None = None, limit: int = 50
) -> Call[list[QueueStats]]:
    return Call(
        f"SELECT {_QUEUE_STATS} FROM batonq.queue_page(%s::text[], %s, %s, %s)",
        (_scopes(scopes), search, after, limit),
        _all(QueueStats),
    )


def queue_count(scopes: Sequence[str] = ("*",), *, search: str | None = None) -> Call[int]:
    return Call(
        "SELECT batonq.queue_count(%s::text[], %s)", (_scopes(scopes), search), lambda rows: int(rows[0][0])
    )


def throughput(queues: Sequence[str], minutes: int = 15) -> Call[list[Throughput]]:
    return Call("SELECT * FROM batonq.throughput(%s::text[], %s)", (list(queues), minutes), _all(Throughput))


def find_tasks(
    queue: str,
    *,
    state: str | None = None,
    idempotency_key: str | None = None,
    worker: str | None = None,
    limit: int = 50,
    before_id: int | str | None = None,
) -> Call[list[Task]]:
    return Call(
        f"SELECT {_TASK} FROM batonq.find_tasks(%s, %s, %s, %s, %s, %s)",
        (queue, state, idempotency_key, worker, limit, None if before_id is None else task_id(before_id)),
        _all(Task),
    )


def tasks_by_key(scopes: Sequence[str], key: str, limit: int = 50) -> Call[list[Task]]:
    return Call(
        f"SELECT {_TASK} FROM batonq.tasks_by_key(%s::text[], %s, %s)",
        (_scopes(scopes), key, limit),
        _all(Task),
    )


def dead_tasks(
    scopes: Sequence[str] = ("*",),
    *,
    queue: str | None = None,
    error: str | None = None,
    limit: int = 50,
    before_id: int | str | None = None,
) -> Call[list[Task]]:
    return Call(
        f"SELECT {_TASK} FROM batonq.dead_tasks(%s::text[], %s, %s, %s, %s)",
        (_scopes(scopes), queue, error, limit, None if before_id is None else task_id(before_id)),
        _all(Task),
    )


def worker_scorecards(scopes: Sequence[str] = ("*",), *, since_s: float = 86400.0) -> Call[list[Scorecard]]:
    return Call(
        "SELECT * FROM batonq.worker_scorecards(%s::text[], %s)",
        (_scopes(scopes), float(since_s)),
        _all(Scorecard),
    )


def add_schedule(
    name: str,
    cron: str,
    queue: str,
    payload: JSON = None,
    *,
    tz: str = "UTC",
    missed: str = "fire-once",
    actor: str | None = None,
) -> Call[Schedule]:
    schedules.check(cron, tz)
    return Call(
        "SELECT * FROM batonq.add_schedule(%s, %s, %s, %s, %s, %s, %s)",
        (name, cron, queue, _json({} if payload is None else payload), tz, missed, actor),
        _one(Schedule),
    )


def remove_schedule(name: str, *, actor: str | None = None) -> Call[bool]:
    return Call("SELECT batonq.remove_schedule(%s, %s)", (name, actor), lambda rows: bool(rows[0][0]))


def pause_schedule(name: str, paused: bool, *, actor: str | None = None) -> Call[Schedule]:
    return Call("SELECT * FROM batonq.pause_schedule(%s, %s, %s)", (name, paused, actor), _one(Schedule))


def schedules_list(queues: Sequence[str] | None = None) -> Call[list[Schedule]]:
    return Call(
        "SELECT * FROM batonq.list_schedules(%s::text[])",
        (None if queues is None else list(queues),),
        _all(Schedule),
    )


def schedule(name: str) -> Call[Schedule | None]:
    return Call("SELECT * FROM batonq.get_schedule(%s)", (name,), _maybe(Schedule))


def schedule_firings(name: str, limit: int = 50) -> Call[list[ScheduleFiring]]:
    return Call("SELECT * FROM batonq.list_schedule_firings(%s, %s)", (name, limit), _all(ScheduleFiring))


def settings_audit(
    *, kind: str | None = None, name: str | None = None, limit: int = 50, before_id: int | None = None
) -> Call[list[AuditEntry]]:
    return Call(
        "SELECT * FROM batonq.list_settings_audit(%s, %s, %s, %s)",
        (kind, name, limit, before_id),
        _all(AuditEntry),
    )
