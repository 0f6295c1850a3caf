"""The typed objects the client returns. A task, a queue's counts and its
settings are read by column name; the others by position, in the order of
the engine's composite types (a test checks it). A field's metadata
(``shown``) says how HTTP and MCP send it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from batonq.errors import InvalidArgument, InvalidToken, LeaseLost, TaskFinished, TaskNotFound

__all__ = [
    "JSON",
    "MISSING",
    "SHOWN",
    "ApiKey",
    "AuditEntry",
    "Edge",
    "Enqueued",
    "KeyAuth",
    "Lease",
    "NewKey",
    "QueueConfig",
    "QueueStats",
    "RunStatus",
    "Schedule",
    "ScheduleFiring",
    "Scorecard",
    "SessionAuth",
    "SetAsideWrite",
    "Shown",
    "Submitted",
    "Task",
    "Throughput",
    "shown",
    "task_id",
    "task_ref",
]

JSON = Any
"""Any value that JSON can hold."""

TASK_STATES = ("waiting", "held", "pending", "leased", "done", "dead", "cancelled")
STATE_FILTERS = ("waiting", "held", "pending", "scheduled", "leased", "done", "dead", "cancelled")
"""What a task list filters by: a state, or ``scheduled`` (pending with a
``run_at`` still ahead)."""
FINISHED_STATES = ("done", "dead", "cancelled")
SET_ASIDE_KINDS = ("complete", "fail", "heartbeat", "release")
AUDITED_KINDS = ("queue", "schedule")
MISSED_TICKS = ("fire-once", "skip")  # what a schedule does with ticks missed while no firer ran


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""Marks an argument not given, where None (JSON null) is a value."""


SHOWN = "batonq.shown"
"""The key of a field's metadata that holds its ``Shown``."""


@dataclass(frozen=True, slots=True)
class Shown:
    """How a model's field is shown over HTTP and MCP (``schemas`` derives
    the response bodies from it): under ``name`` (the field's own when
    None), with ``description``; a task id (``ref``) as ``t_5521``;
    ``choices``: the only values it takes; ``sent=False``: kept for Python
    callers, never sent."""

    description: str | None = None
    name: str | None = None
    ref: bool = False
    choices: tuple[str, ...] | None = None
    sent: bool = True


def shown(
    description: str | None = None,
    *,
    name: str | None = None,
    ref: bool = False,
    choices: tuple[str, ...] | None = None,
    sent: bool = True,
) -> dict[str, Shown]:
    """A field's metadata saying how it is shown:
    ``errors: list[...] = field(metadata=shown("every attempt's error"))``."""
    return {SHOWN: Shown(description, name, ref, choices, sent)}


def task_id(value: int | str) -> int:
    """Accept a task id as ``5521`` or ``"t_5521"``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value[2:] if value.startswith("t_") else value
        # ASCII digits only: str.isdigit() also passes "²" (which int()
        # rejects with a ValueError) and other scripts' digits.
        if text.isascii() and text.isdigit() and len(text) <= 18:
            return int(text)
    raise InvalidArgument(f"task id must look like t_5521 or 5521, got {value!r}")


def task_ref(task_id: int) -> str:
    """A task id as users see it: ``t_5521`` (``task_id`` reads it back)."""
    return f"t_{task_id}"


@dataclass(frozen=True, slots=True)
class Enqueued:
    """The answer to an enqueue: ``created`` is false when the key existed."""

    task_id: int
    queue: str
    created: bool
    state: str
    run_at: datetime


# Lease and Submitted are made once per claimed task, so they are not frozen:
# a frozen dataclass's __init__ sets each field through object.__setattr__,
# 8x the cost (1.3 against 0.16 us for Lease's 15 fields).
@dataclass(slots=True)
class Lease:
    """A claimed task: ``row`` is its input (the payload it was enqueued
    with), the rest says about the lease and the task (``group``: the group
    it was enqueued in, if any). Present ``lease_token`` with every write
    about it."""

    task_id: int
    queue: str
    fencing_token: int
    lease_token: str = field(repr=False)
    lease_expires_at: datetime
    lease_expires_in_s: float
    attempt: int
    max_attempts: int
    priority: int
    row: JSON
    idempotency_key: str | None
    parent_id: int | None
    root_id: int
    created_at: datetime
    run_at: datetime
    group: str | None
    trace_context: JSON = field(default=None, repr=False)
    """The W3C trace context of the span that enqueued the task (batonq.tracing)."""


@dataclass(slots=True)
class Submitted:
    """The answer to a complete, fail, heartbeat or release.

    ``outcome`` is ``accepted``, ``replayed`` (the same write from the same
    lease was accepted before; nothing changed), ``lease_lost`` or
    ``finished`` (refused). An item of ``complete_many`` may also be
    ``not_found`` or ``invalid_token``, with no ``state``.
    """

    task_id: int
    queue: str
    outcome: str
    state: str | None
    fencing_token: int
    current_fencing_token: int | None
    lease_expires_at: datetime | None
    lease_expires_in_s: float | None

    @property
    def replayed(self) -> bool:
        return self.outcome == "replayed"

    @property
    def accepted(self) -> bool:
        return self.outcome in ("accepted", "replayed")

    def or_raise(self) -> Submitted:
        """This reply if the write was accepted (or replayed); else raise
        ``LeaseLost`` (``TaskFinished`` when the task is finished),
        ``TaskNotFound`` or ``InvalidToken``."""
        if self.outcome == "not_found":
            raise TaskNotFound(f"task {self.task_id} not found in queue {self.queue}", task_id=self.task_id)
        if self.outcome == "invalid_token":
            raise InvalidToken(f"wrong lease token for task {self.task_id}", task_id=self.task_id)
        state = self.state or "unknown"
        if self.outcome == "finished":
            raise TaskFinished(self.task_id, state, self.fencing_token, self.current_fencing_token)
        if self.outcome == "lease_lost":
            raise LeaseLost(self.task_id, state, self.fencing_token, self.current_fencing_token)
        return self


@dataclass(frozen=True, slots=True)
class Task:
    """A task as readers see it, hot or archived. Never holds a lease token.

    The one definition of a task's fields: the clients read them by name
    from ``batonq.task_view``, and ``schemas.TaskOut`` (what HTTP and MCP
    send) is derived from them, in this order."""

    id: int = field(metadata=shown(name="task_id", ref=True))
    queue: str
    state: str = field(metadata=shown(choices=TASK_STATES))
    priority: int
    payload: JSON
    attempts: int
    max_attempts: int
    idempotency_key: str | None
    parent_id: int | None = field(metadata=shown(ref=True))
    root_id: int = field(metadata=shown(ref=True))
    fencing_token: int | None
    run_at: datetime
    created_at: datetime
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    stage: str | None
    last_error: str | None
    errors: list[dict[str, Any]] = field(metadata=shown("every attempt's error, oldest first"))
    result: JSON
    group: str | None = field(
        metadata=shown("the group the task counts against (group_max_leased, group_rate_limit)")
    )


@dataclass(frozen=True, slots=True)
class SetAsideWrite:
    """A write about a task that was refused and set aside: its ``kind``
    (complete, fail, heartbeat, release), the ``fencing_token`` it presented,
    when, the task's ``state`` then, and who held the lease that token names
    (``worker`` and the claiming API key's ``key_id``; None when unknown)."""

    task_id: int = field(metadata=shown(ref=True))
    kind: str = field(metadata=shown(choices=SET_ASIDE_KINDS))
    fencing_token: int = field(metadata=shown("the token the write presented"))
    at: datetime
    state: str = field(metadata=shown("the task's state when the write was refused", choices=TASK_STATES))
    worker: str | None = field(metadata=shown("the worker that held that token's lease; null when unknown"))
    key_id: int | None = field(
        metadata=shown("the API key that claimed that lease; null when none or unknown")
    )


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Tasks per state in one queue; ``pending`` counts the claimable now,
    ``scheduled`` the pending whose run_at is still ahead."""

    queue: str
    paused: bool
    waiting: int
    held: int
    pending: int
    scheduled: int
    leased: int
    done: int
    dead: int
    cancelled: int
    oldest_pending_age_s: float | None


@dataclass(frozen=True, slots=True)
class QueueConfig:
    name: str
    lease_s: int
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    retention_s: int
    max_body_bytes: int
    paused: bool
    created_at: datetime
    max_leased: int | None = field(
        metadata=shown("at most this many of the queue's tasks leased at once (all workers); null: no limit")
    )
    group_max_leased: int | None = field(
        metadata=shown("at most this many tasks of one group leased at once; null: no limit")
    )
    rate_limit: int | None = field(metadata=shown("claims per rate_period_s (a token bucket); null: none"))
    group_rate_limit: int | None = field(metadata=shown("claims per rate_period_s per group; null: none"))
    rate_period_s: float = field(metadata=shown("the rate limits' period in seconds"))

    @property
    def limits(self) -> list[str]:
        """The limits set, in words, each to be read after "at most"
        (``["3 leased", "1 per group", "20 claims per 1 s"]``); empty when
        there are none."""
        per = f"per {self.rate_period_s:g} s"
        words = [
            (self.max_leased, f"{self.max_leased} leased"),
            (self.group_max_leased, f"{self.group_max_leased} per group"),
            (self.rate_limit, f"{self.rate_limit} claims {per}"),
            (self.group_rate_limit, f"{self.group_rate_limit} claims {per} per group"),
        ]
        return [text for limit, text in words if limit is not None]


@dataclass(frozen=True, slots=True)
class Edge:
    """An edge of the queue graph: what a finished task in ``from_queue``
    hands to ``to_queue``. Pointers are JSON pointers (``/items/0``)."""

    from_queue: str
    to_queue: str
    map: str | None
    fan_out: str | None
    when_pointer: str | None
    when_equals: JSON
    when_present: bool | None
    is_join: bool
    partial: bool
    priority: int | None
    delay_s: float


@dataclass(frozen=True, slots=True)
class RunStatus:
    """A run (every task under one root), derived from its tasks' states:
    ``failed`` names the first dead task and its error."""

    root_id: int
    status: str
    tasks: int
    unfinished: int
    done: int
    dead: int
    cancelled: int
    failed_task_id: int | None
    failed_queue: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as listed: never its secret."""

    id: int
    name: str
    ring: int
    queues: list[str]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key just made: ``key`` is shown this once."""

    key: str = field(repr=False, metadata=shown("shown this once: store it now"))
    id: int
    name: str
    ring: int
    queues: list[str]


@dataclass(frozen=True, slots=True)
class KeyAuth:
    """What checking a presented key needs (the hash is compared by the caller)."""

    secret_hash: bytes = field(repr=False)
    ring: int
    queues: list[str]
    revoked: bool


@dataclass(frozen=True, slots=True)
class SessionAuth:
    """The key behind a dashboard session: its id, ring and queue scopes."""

    key_id: int
    ring: int
    queues: list[str]


@dataclass(frozen=True, slots=True)
class Throughput:
    """Tasks of a queue that finished within one minute."""

    queue: str
    minute: datetime
    done: int
    dead: int


@dataclass(frozen=True, slots=True)
class Scorecard:
    """One worker name's record over a time window (see ``worker_scorecards``);
    ``worker`` is None for what no worker name is recorded for (e.g. a late
    write under a released lease)."""

    worker: str | None
    done: int
    failed: int
    dead: int
    late_writes: int
    median_s: float | None
    last_seen: datetime | None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A cron schedule: each tick of ``cron`` (read in time zone ``tz``)
    enqueues ``payload`` into ``queue``. ``missed``: what a tick that passed
    while no firer ran does, ``fire-once`` (one task for all of them) or
    ``skip``. ``next_tick`` is None until the firer has reckoned it."""

    name: str
    cron: str
    tz: str
    queue: str
    payload: JSON
    missed: str = field(metadata=shown(choices=MISSED_TICKS))
    paused: bool
    armed_at: datetime = field(metadata=shown(sent=False))
    next_tick: datetime | None = field(metadata=shown("null until the sweeper has reckoned it"))
    last_tick: datetime | None
    last_task_id: int | None = field(metadata=shown(ref=True))
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ScheduleFiring:
    """The task one tick of a schedule enqueued; ``catch_up``: fired late,
    for the ticks missed while no firer ran."""

    schedule: str
    tick: datetime
    task_id: int
    catch_up: bool
    fired_at: datetime


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change to a queue's settings or a schedule: ``actor`` is the API
    key (``key:7``) or the database role that made it; ``before`` is None
    for a creation, ``after`` None for a removal."""

    id: int
    at: datetime
    actor: str = field(metadata=shown("the API key (key:7) or database role that made the change"))
    kind: str = field(metadata=shown(choices=AUDITED_KINDS))
    name: str
    before: dict[str, Any] | None = field(metadata=shown("null: created"))
    after: dict[str, Any] | None = field(metadata=shown("null: removed"))
