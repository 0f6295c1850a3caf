"""Request and response bodies of the /v1 API (they make /openapi.json)."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Self, cast

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from batonq import models
from batonq.limits import (
    MAX_ATTEMPTS,
    MAX_DELAY_S,
    MAX_GROUP_LENGTH,
    MAX_LEASE_S,
    MAX_LIST_ITEMS,
    MAX_QUEUE_BODY_BYTES,
    MAX_RATE_PERIOD_S,
    MAX_WAIT_S,
    MIN_LEASE_S,
    MIN_RATE_PERIOD_S,
    QUEUE_NAME_PATTERN,
)
from batonq.models import task_ref


def _integral(value: Any) -> Any:
    """JSON Schema counts 177.0 as an integer; so does the API."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


_BOUND_ERRORS = frozenset({"greater_than_equal", "less_than_equal", "greater_than", "less_than"})


def _between(low: float, high: float) -> WrapValidator:
    """A bound broken reads "must be between 1 and 3600 (got 7200)" (the
    error handler puts the field's name, as sent, in front)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as error:
            if error.errors()[0]["type"] not in _BOUND_ERRORS:
                raise
            raise PydanticCustomError(
                "out_of_range", "must be between {low} and {high} (got {got})",
                {"low": low, "high": high, "got": value},
            ) from None  # fmt: skip

    return WrapValidator(check)


MAX_ID = 2**53
"""The largest id taken as a JSON number (beyond it a double cannot hold it);
the string forms take any."""
TASK_ID_PATTERN = r"^(t_)?[0-9]{1,18}$"
"""A task id as the API takes it: ``t_5521`` or ``5521``."""

# Integer fields of request bodies (strict otherwise). The bounds come before
# the validator, or pydantic writes them into /openapi.json as unknown words.
_Integral = BeforeValidator(_integral)
TaskNumber = Annotated[int, Field(ge=0, le=MAX_ID), _Integral, _between(0, MAX_ID)]
LeaseS = Annotated[int, Field(ge=MIN_LEASE_S, le=MAX_LEASE_S), _Integral, _between(MIN_LEASE_S, MAX_LEASE_S)]
Attempts = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS), _Integral, _between(1, MAX_ATTEMPTS)]
Priority = Annotated[int, Field(ge=-(2**31), le=2**31 - 1), _Integral, _between(-(2**31), 2**31 - 1)]
# Over 1,000 is not a malformed claim but one too large: 413 too_many_items,
# like the list caps (checked by the claim itself); the schema says the bound.
MaxTasks = Annotated[
    int, Field(ge=1, json_schema_extra={"maximum": MAX_LIST_ITEMS}), _Integral, _between(1, MAX_LIST_ITEMS)
]
RetentionS = Annotated[int, Field(ge=0, le=2**31 - 1), _Integral, _between(0, 2**31 - 1)]
Limit = Annotated[int, Field(ge=0, le=2**31 - 1), _Integral, _between(0, 2**31 - 1)]
RatePeriodS = Annotated[
    float, Field(ge=MIN_RATE_PERIOD_S, le=MAX_RATE_PERIOD_S), _between(MIN_RATE_PERIOD_S, MAX_RATE_PERIOD_S)
]
BodyBytes = Annotated[
    int, Field(ge=1, le=MAX_QUEUE_BODY_BYTES), _Integral, _between(1, MAX_QUEUE_BODY_BYTES)
]
Ring = Annotated[int, Field(ge=0, le=3), _Integral, _between(0, 3)]

TaskRef = TaskNumber | Annotated[str, Field(pattern=TASK_ID_PATTERN)]
"""A task id, as ``t_5521`` or ``5521``."""
DelayS = Annotated[float, Field(ge=0, le=MAX_DELAY_S), _between(0, MAX_DELAY_S)]
WaitS = Annotated[float, Field(ge=0, le=MAX_WAIT_S), _between(0, MAX_WAIT_S)]
FencingToken = Annotated[int, Field(ge=1, le=MAX_ID), _Integral, _between(1, MAX_ID)]

State = Literal["waiting", "held", "pending", "leased", "done", "dead", "cancelled"]
StateFilter = Literal["waiting", "held", "pending", "scheduled", "leased", "done", "dead", "cancelled"]
"""A list's filter (models.STATE_FILTERS): a state, or ``scheduled``, the
pending whose run_at is still ahead."""
RunState = Literal["running", "done", "failed"]
Missed = Literal["fire-once", "skip"]  # models.MISSED_TICKS
QueueName = Field(pattern=QUEUE_NAME_PATTERN, examples=["shop:tasks"])


def tid(value: int | None) -> str | None:
    return None if value is None else task_ref(value)


def _sent_type(annotation: Any, how: models.Shown) -> Any:
    """The type a field is sent as: a task id as text, choices as a Literal."""
    if how.ref:
        return str | None if type(None) in typing.get_args(annotation) else str
    if how.choices is not None:
        return Literal[how.choices]
    return annotation


class Derived(BaseModel):
    """A response body derived from one of ``models``' dataclasses:
    ``class TaskOut(Derived, of=models.Task)`` has the dataclass's fields, in
    its order, each as its metadata says (``models.shown``); ``TaskOut.of(task)``
    converts one. A field added to the dataclass is sent with no other change."""

    # (the dataclass's field, its name here, is a task id) for each field.
    _shown: ClassVar[tuple[tuple[str, str, bool], ...]] = ()

    def __init_subclass__(cls, of: type | None = None, **kwargs: Any) -> None:
        # Before pydantic collects the class's fields: they are added here as
        # if written in the class body.
        super().__init_subclass__(**kwargs)
        if of is None:
            return
        hints = typing.get_type_hints(of)
        annotations = inspect.get_annotations(cls)
        shown = []
        for field in dataclasses.fields(of):
            how = field.metadata.get(models.SHOWN, models.Shown())
            if not how.sent:
                continue
            name = how.name or field.name
            annotations[name] = _sent_type(hints[field.name], how)
            if how.description is not None:
                setattr(cls, name, Field(description=how.description))
            shown.append((field.name, name, how.ref))
        cls.__annotations__ = annotations
        cls._shown = tuple(shown)

    @classmethod
    def of(cls, source: Any) -> Self:
        """``source`` (an instance of the dataclass) as this body."""
        values = {}
        for field, name, ref in cls._shown:
            value = getattr(source, field)
            values[name] = tid(value) if ref else value
        return cls.model_validate(values)


class Strict(BaseModel):
    """A request body: unknown fields are refused, and so are values of the
    wrong JSON type (``"paused": 0`` is not a boolean), as /openapi.json says.
    A field with an alias may be given under one of its names, not both."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _one_name_each(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for field in cls.model_fields.values():
                if isinstance(field.validation_alias, AliasChoices):
                    names = [str(n) for n in field.validation_alias.choices if n in data]
                    if len(names) > 1:
                        raise ValueError(f"give {' or '.join(names)}, not both")
        return data


class EnqueueIn(Strict):
    queue: str = QueueName
    payload: Any = Field(description="any JSON value, at most the queue's max_body_bytes (128 KiB)")
    idempotency_key: str | None = Field(
        None, max_length=512, description="the same key in the same queue returns the existing task"
    )
    priority: Priority = Field(0, description="higher first")
    delay_s: DelayS = Field(
        0,
        validation_alias=AliasChoices("delay_s", "delay_seconds"),
        description="claimable only this much later",
    )
    max_attempts: Attempts | None = None
    held: bool = Field(False, description="enqueue held: not claimable until released")
    parent: TaskRef | None = Field(None, description="the parent task, for lineage")
    debounce_key: str | None = Field(
        None, min_length=1, max_length=512,
        description="debounce: enqueues of this key less than debounce_s apart make one task",
    )  # fmt: skip
    debounce_s: float | None = Field(
        None, gt=0, le=86400, description="the window: the task runs this long after the key's last enqueue"
    )
    max_wait_s: float | None = Field(
        None, gt=0, le=315360000, description="with debounce: run at the latest this long after the first"
    )
    keep: Literal["last", "first"] = Field("last", description="with debounce: the payload the task carries")
    group: str | None = Field(
        None, min_length=1, max_length=MAX_GROUP_LENGTH, examples=["customer-42"],
        description="the task's group (a customer id, say): the queue's group_max_leased and"
        " group_rate_limit cap each group",
    )  # fmt: skip


class EnqueueOut(BaseModel):
    task_id: str
    queue: str
    created: bool
    state: State
    run_at: datetime

    @classmethod
    def of(cls, e: models.Enqueued) -> EnqueueOut:
        return cls(
            task_id=task_ref(e.task_id),
            queue=e.queue,
            created=e.created,
            state=cast(State, e.state),
            run_at=e.run_at,
        )


class EnqueueManyOut(BaseModel):
    tasks: list[EnqueueOut]


class ClaimIn(Strict):
    queue: str = QueueName
    worker: str | None = Field(None, max_length=200)
    max_tasks: MaxTasks | None = Field(
        None, description="up to this many tasks, answered as a list; omitted or 1: one task, answered alone"
    )
    lease_s: LeaseS | None = Field(
        None,
        validation_alias=AliasChoices("lease_s", "lease_seconds"),
        description="default: the queue's (300)",
    )
    wait_s: WaitS = Field(
        0,
        validation_alias=AliasChoices("wait_s", "wait_seconds"),
        description="long-poll an empty queue this long",
    )


class ClaimedTask(BaseModel):
    """A claimed task: what it is (``task_id``, ``fencing_token``,
    ``lease_expires_in_s``, ``row``), then the rest of its lease and task."""

    task_id: str
    fencing_token: int
    lease_expires_in_s: int = Field(description="the lease's length in seconds, from the claim")
    row: Any = Field(description="the task's input: the payload it was enqueued with")
    lease_token: str = Field(
        description="present it with every write about the task (or send task_id and"
        " fencing_token from the key that claimed it)"
    )
    lease_expires_at: datetime
    attempt: int
    max_attempts: int
    queue: str
    priority: int
    idempotency_key: str | None
    parent_id: str | None
    root_id: str
    created_at: datetime
    run_at: datetime
    group: str | None
    trace_context: dict[str, str] | None = Field(
        None,
        description="the W3C trace context of the span that enqueued the task ({traceparent, tracestate}),"
        " for the worker's span to continue; null when the enqueuer was not traced",
    )

    @classmethod
    def of(cls, lease: models.Lease) -> ClaimedTask:
        return cls(
            task_id=task_ref(lease.task_id), fencing_token=lease.fencing_token,
            lease_expires_in_s=round(lease.lease_expires_in_s), row=lease.row,
            lease_token=lease.lease_token, lease_expires_at=lease.lease_expires_at,
            attempt=lease.attempt, max_attempts=lease.max_attempts, queue=lease.queue,
            priority=lease.priority, idempotency_key=lease.idempotency_key,
            parent_id=tid(lease.parent_id), root_id=task_ref(lease.root_id),
            created_at=lease.created_at, run_at=lease.run_at, group=lease.group,
            trace_context=lease.trace_context if isinstance(lease.trace_context, dict) else None,
        )  # fmt: skip


class NoTask(BaseModel):
    """A one-task claim that found none: the same fields, null."""

    task_id: None
    fencing_token: None
    lease_expires_in_s: None
    row: None


NO_TASK = NoTask(task_id=None, fencing_token=None, lease_expires_in_s=None, row=None)


class ClaimOut(BaseModel):
    tasks: list[ClaimedTask]


class ByToken(Strict):
    """A write that names its lease by the lease token the claim returned."""

    lease_token: str = Field(max_length=300)


class ByFence(Strict):
    """A write that names its lease by task and fencing token: taken from the
    API key that claimed it only."""

    task_id: TaskRef
    fencing_token: FencingToken


def _named_by(value: Any) -> str:
    return "ByToken" if isinstance(value, dict) and "lease_token" in value else "ByFence"


LeaseRef = ByToken | ByFence
"""How a write names its lease."""


class _Heartbeat(Strict):
    lease_s: LeaseS | None = Field(None, validation_alias=AliasChoices("lease_s", "lease_seconds"))
    stage: str | None = Field(None, max_length=1000)


class HeartbeatByToken(ByToken, _Heartbeat):
    pass


class HeartbeatByFence(ByFence, _Heartbeat):
    pass


class _Submit(Strict):
    result: Any = None


class SubmitByToken(ByToken, _Submit):
    pass


class SubmitByFence(ByFence, _Submit):
    pass


class _Fail(Strict):
    error: Any = None
    retry_delay_s: DelayS | None = Field(
        None, validation_alias=AliasChoices("retry_delay_s", "retry_delay_seconds")
    )
    requeue: bool = True


class FailByToken(ByToken, _Fail):
    pass


class FailByFence(ByFence, _Fail):
    pass


# A body with lease_token is checked as one by token, any other by fence: its
# errors are that form's alone.
HeartbeatIn = Annotated[
    Annotated[HeartbeatByToken, Tag("ByToken")] | Annotated[HeartbeatByFence, Tag("ByFence")],
    Discriminator(_named_by),
]
SubmitIn = Annotated[
    Annotated[SubmitByToken, Tag("ByToken")] | Annotated[SubmitByFence, Tag("ByFence")],
    Discriminator(_named_by),
]
FailIn = Annotated[
    Annotated[FailByToken, Tag("ByToken")] | Annotated[FailByFence, Tag("ByFence")],
    Discriminator(_named_by),
]
ReleaseIn = Annotated[
    Annotated[ByToken, Tag("ByToken")] | Annotated[ByFence, Tag("ByFence")], Discriminator(_named_by)
]


class HeartbeatOut(BaseModel):
    task_id: str
    lease_expires_in_s: float
    lease_expires_at: datetime


class SubmitOut(BaseModel):
    task_id: str
    state: State
    replayed: bool
    fencing_token: int

    @classmethod
    def of(cls, s: models.Submitted) -> SubmitOut:
        return cls(
            task_id=task_ref(s.task_id),
            state=cast(State, s.state),
            replayed=s.replayed,
            fencing_token=s.fencing_token,
        )


SubmitOutcome = Literal["accepted", "replayed", "lease_lost", "finished", "not_found", "invalid_token"]


class SubmitResultOut(BaseModel):
    """One item of a list submit: ``outcome`` says whether it was taken."""

    task_id: str
    outcome: SubmitOutcome = Field(
        description="accepted; replayed (the same submit from the same lease was accepted before);"
        " lease_lost or finished: refused, another holder has the task or it is finished;"
        " not_found: no such task in that queue; invalid_token: the token's secret is wrong"
    )
    state: State | None = Field(description="the task's state; null for not_found and invalid_token")
    replayed: bool
    fencing_token: int
    current_fencing_token: int | None = Field(description="the task's newest token")

    @classmethod
    def of(cls, s: models.Submitted) -> SubmitResultOut:
        return cls(
            task_id=task_ref(s.task_id),
            outcome=cast(SubmitOutcome, s.outcome),
            state=cast(State | None, s.state),
            replayed=s.replayed,
            fencing_token=s.fencing_token,
            current_fencing_token=s.current_fencing_token,
        )


class SubmitManyOut(BaseModel):
    results: list[SubmitResultOut] = Field(description="in the order of the request")


class TaskOut(Derived, of=models.Task):
    pass


class TaskListOut(BaseModel):
    tasks: list[TaskOut]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null at the end")


class RunOut(BaseModel):
    root_id: str
    status: RunState
    tasks: int
    unfinished: int
    done: int
    dead: int
    cancelled: int
    failed_task_id: str | None
    failed_queue: str | None
    error: str | None

    @classmethod
    def of(cls, r: models.RunStatus, covers: Callable[[str], bool]) -> RunOut:
        """The run as a key sees it: where and why it failed only if the key
        covers the failed task's queue."""
        shown = r.failed_queue is not None and covers(r.failed_queue)
        return cls(
            root_id=task_ref(r.root_id), status=cast(RunState, r.status), tasks=r.tasks,
            unfinished=r.unfinished, done=r.done, dead=r.dead, cancelled=r.cancelled,
            failed_task_id=tid(r.failed_task_id) if shown else None,
            failed_queue=r.failed_queue if shown else None, error=r.error if shown else None,
        )  # fmt: skip


class SetAsideOut(Derived, of=models.SetAsideWrite):
    """A write refused and set aside (a late or forged complete, fail,
    heartbeat or release), with who held the lease its token names."""


class TaskDetailOut(TaskOut):
    run: RunOut
    lineage: list[TaskOut] = Field(description="every task of this task's run, oldest first (at most 200)")
    set_aside: list[SetAsideOut] = Field(description="the task's refused writes, oldest first")


class QueueStatsOut(Derived, of=models.QueueStats):
    pass


class QueuesOut(BaseModel):
    queues: list[QueueStatsOut]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null at the end")


class QueueSettingsIn(Strict):
    lease_s: LeaseS | None = Field(None, validation_alias=AliasChoices("lease_s", "lease_seconds"))
    max_attempts: Attempts | None = None
    backoff_base_s: DelayS | None = None
    backoff_max_s: DelayS | None = None
    retention_s: RetentionS | None = None
    max_body_bytes: BodyBytes | None = None
    paused: bool | None = None
    max_leased: Limit | None = Field(
        None, description="at most this many of the queue's tasks leased at once (all workers); 0 removes it"
    )
    group_max_leased: Limit | None = Field(
        None, description="at most this many tasks of one group leased at once; 0 removes it"
    )
    rate_limit: Limit | None = Field(
        None, description="at most this many claims per rate_period_s; 0 removes it"
    )
    group_rate_limit: Limit | None = Field(
        None, description="at most this many claims per rate_period_s for each group; 0 removes it"
    )
    rate_period_s: RatePeriodS | None = Field(
        None, description="the rate limits' period in seconds (default 1)"
    )


class QueueSettingsOut(Derived, of=models.QueueConfig):
    pass


class EdgeIn(Strict):
    from_queue: str = QueueName
    to_queue: str = QueueName
    map: str | None = Field(None, description="JSON pointer into the result: the next payload")
    fan_out: str | None = Field(None, description="JSON pointer to an array: one task per element")
    when: str | None = Field(None, description="JSON pointer the condition looks at")
    equals: Any = Field(None, description="route when the value at `when` equals this")
    present: bool | None = Field(None, description="route when `when` is present (true) or absent (false)")
    join: bool = False
    partial: bool = False
    priority: Priority | None = None
    delay_s: DelayS = Field(0, validation_alias=AliasChoices("delay_s", "delay_seconds"))


class EdgeOut(Derived, of=models.Edge):
    pass


class GraphOut(BaseModel):
    edges: list[EdgeOut]


class KeyIn(Strict):
    ring: Ring = Field(description="0 admin, 1 operator, 2 worker, 3 observer")
    queues: list[str] = Field(default_factory=lambda: ["*"], min_length=1, description="glob patterns")
    name: str = Field("", max_length=200)


class KeyOut(Derived, of=models.ApiKey):
    pass


class NewKeyOut(Derived, of=models.NewKey):
    pass


class KeysOut(BaseModel):
    keys: list[KeyOut]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


class ScheduleIn(Strict):
    name: str = Field(pattern=QUEUE_NAME_PATTERN, examples=["nightly-report"])
    cron: str = Field(
        min_length=1, max_length=200, examples=["*/5 * * * *"],
        description="five cron fields, or six with seconds first",
    )  # fmt: skip
    queue: str = QueueName
    payload: Any = Field(default_factory=dict, description="what each tick enqueues")
    tz: str = Field("UTC", max_length=64, examples=["Europe/Berlin"], description="IANA time zone")
    missed: Missed = Field(
        "fire-once", description="ticks missed while no sweeper ran: one task for them all, or none"
    )


class ScheduleOut(Derived, of=models.Schedule):
    pass


class SchedulesOut(BaseModel):
    schedules: list[ScheduleOut]


class AuditEntryOut(Derived, of=models.AuditEntry):
    pass


class AuditOut(BaseModel):
    entries: list[AuditEntryOut]
    next_before_id: int | None = Field(
        description="send as before_id for the next page; null at the end. A page may hold fewer"
        " entries than limit (those of queues the key does not cover are left out) and still go on"
    )
