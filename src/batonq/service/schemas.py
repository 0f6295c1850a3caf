"""Request and response bodies of the /v1 API (they make /openapi.json)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from batonq import models
from batonq.operations import task_ref


def _integral(value: Any) -> Any:
    """JSON Schema counts 177.0 as an integer; so does the API."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


MAX_ID = 2**53
"""The largest id taken as a JSON number (beyond it a double cannot hold it);
the string forms take any."""
TASK_ID_PATTERN = r"^(t_)?[0-9]{1,18}$"
"""A task id as the API takes it: ``t_5521`` or ``5521``."""

# Integer fields of request bodies (strict otherwise). The bounds come before
# the validator, or pydantic writes them into /openapi.json as unknown words.
_Integral = BeforeValidator(_integral)
TaskNumber = Annotated[int, Field(ge=0, le=MAX_ID), _Integral]
LeaseS = Annotated[int, Field(ge=1, le=3600), _Integral]
Attempts = Annotated[int, Field(ge=1, le=1000), _Integral]
Priority = Annotated[int, Field(ge=-(2**31), lt=2**31), _Integral]
MaxTasks = Annotated[int, Field(ge=1, le=1000), _Integral]
RetentionS = Annotated[int, Field(ge=0, lt=2**31), _Integral]
BodyBytes = Annotated[int, Field(ge=1, le=104857600), _Integral]
Ring = Annotated[int, Field(ge=0, le=3), _Integral]

TaskRef = TaskNumber | Annotated[str, Field(pattern=TASK_ID_PATTERN)]
"""A task id, as ``t_5521`` or ``5521``."""
MAX_DELAY_S = 315360000
"""Ten years: the longest delay or backoff the API takes."""

State = Literal["waiting", "held", "pending", "leased", "done", "dead", "cancelled"]
RunState = Literal["running", "done", "failed"]
QUEUE_PATTERN = r"^[a-z0-9][a-z0-9_.:-]{0,127}$"
QueueName = Field(pattern=QUEUE_PATTERN, examples=["shop:tasks"])


def tid(value: int | None) -> str | None:
    return None if value is None else task_ref(value)


class Strict(BaseModel):
    """A request body: unknown fields are refused, and so are values of the
    wrong JSON type (``"paused": 0`` is not a boolean), as /openapi.json says."""

    model_config = ConfigDict(extra="forbid", strict=True)


class EnqueueIn(Strict):
    queue: str = QueueName
    payload: Any = Field(description="any JSON value, at most the queue's max_body_bytes (128 KiB)")
    idempotency_key: str | None = Field(
        None, max_length=512, description="the same key in the same queue returns the existing task"
    )
    priority: Priority = Field(0, description="higher first")
    delay_s: float = Field(0, ge=0, le=MAX_DELAY_S, description="claimable only this much later")
    max_attempts: Attempts | None = None
    held: bool = Field(False, description="enqueue held: not claimable until released")
    parent: TaskRef | None = Field(None, description="the parent task, for lineage")


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
    max_tasks: MaxTasks = 1
    lease_s: LeaseS | None = Field(None, description="default: the queue's (300)")
    wait_s: float = Field(0, ge=0, le=55, description="long-poll an empty queue this long")


class TaskRow(BaseModel):
    queue: str
    payload: Any
    priority: int
    idempotency_key: str | None
    parent_id: str | None
    root_id: str
    created_at: datetime
    run_at: datetime


class ClaimedTask(BaseModel):
    task_id: str
    fencing_token: int
    lease_token: str
    lease_expires_in_s: float
    lease_expires_at: datetime
    attempt: int
    max_attempts: int
    row: TaskRow

    @classmethod
    def of(cls, lease: models.Lease) -> ClaimedTask:
        return cls(
            task_id=task_ref(lease.task_id),
            fencing_token=lease.fencing_token,
            lease_token=lease.lease_token,
            lease_expires_in_s=lease.lease_expires_in_s,
            lease_expires_at=lease.lease_expires_at,
            attempt=lease.attempt,
            max_attempts=lease.max_attempts,
            row=TaskRow(
                queue=lease.queue,
                payload=lease.payload,
                priority=lease.priority,
                idempotency_key=lease.idempotency_key,
                parent_id=tid(lease.parent_id),
                root_id=task_ref(lease.root_id),
                created_at=lease.created_at,
                run_at=lease.run_at,
            ),
        )


class ClaimOut(BaseModel):
    tasks: list[ClaimedTask]


class HeartbeatIn(Strict):
    lease_token: str = Field(max_length=300)
    lease_s: LeaseS | None = None
    stage: str | None = Field(None, max_length=1000)


class HeartbeatOut(BaseModel):
    task_id: str
    lease_expires_in_s: float
    lease_expires_at: datetime


class SubmitIn(Strict):
    lease_token: str = Field(max_length=300)
    result: Any = None


class FailIn(Strict):
    lease_token: str = Field(max_length=300)
    error: Any = None
    retry_delay_s: float | None = Field(None, ge=0, le=MAX_DELAY_S)
    requeue: bool = True


class LeaseTokenIn(Strict):
    lease_token: str = Field(max_length=300)


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


class SubmitResultOut(BaseModel):
    """One item of a list submit: ``outcome`` says whether it was taken."""

    task_id: str
    outcome: Literal["accepted", "replayed", "lease_lost", "finished"] = Field(
        description="accepted; replayed (the same submit was accepted before); lease_lost or finished:"
        " refused, another holder has the task or it is finished"
    )
    state: State
    replayed: bool
    fencing_token: int
    current_fencing_token: int | None = Field(description="the task's newest token")

    @classmethod
    def of(cls, s: models.Submitted) -> SubmitResultOut:
        return cls(
            task_id=task_ref(s.task_id),
            outcome=cast(Literal["accepted", "replayed", "lease_lost", "finished"], s.outcome),
            state=cast(State, s.state),
            replayed=s.replayed,
            fencing_token=s.fencing_token,
            current_fencing_token=s.current_fencing_token,
        )


class SubmitManyOut(BaseModel):
    results: list[SubmitResultOut] = Field(description="in the order of the request")


class TaskOut(BaseModel):
    task_id: str
    queue: str
    state: State
    priority: int
    payload: Any
    attempts: int
    max_attempts: int
    idempotency_key: str | None
    parent_id: str | None
    root_id: str
    fencing_token: int | None
    run_at: datetime
    created_at: datetime
    claimed_at: datetime | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    stage: str | None
    last_error: str | None
    errors: list[dict[str, Any]] = Field(description="every attempt's error, oldest first")
    result: Any

    @classmethod
    def of(cls, t: models.Task) -> TaskOut:
        return cls(
            task_id=task_ref(t.id), queue=t.queue, state=cast(State, t.state), priority=t.priority,
            payload=t.payload,
            attempts=t.attempts, max_attempts=t.max_attempts, idempotency_key=t.idempotency_key,
            parent_id=tid(t.parent_id), root_id=task_ref(t.root_id), fencing_token=t.fencing_token,
            run_at=t.run_at, created_at=t.created_at, claimed_at=t.claimed_at,
            lease_expires_at=t.lease_expires_at, finished_at=t.finished_at, worker=t.worker,
            stage=t.stage, last_error=t.last_error, errors=t.errors, result=t.result,
        )  # fmt: skip


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


class TaskDetailOut(TaskOut):
    run: RunOut
    lineage: list[TaskOut] = Field(description="every task of this task's run, oldest first (at most 200)")


class QueueStatsOut(BaseModel):
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


class QueuesOut(BaseModel):
    queues: list[QueueStatsOut]
    next_cursor: str | None = Field(description="pass as cursor for the next page; null at the end")


class QueueSettingsIn(Strict):
    lease_s: LeaseS | None = None
    max_attempts: Attempts | None = None
    backoff_base_s: float | None = Field(None, ge=0, le=MAX_DELAY_S)
    backoff_max_s: float | None = Field(None, ge=0, le=MAX_DELAY_S)
    retention_s: RetentionS | None = None
    max_body_bytes: BodyBytes | None = None
    paused: bool | None = None


class QueueSettingsOut(BaseModel):
    name: str
    lease_s: int
    max_attempts: int
    backoff_base_s: float
    backoff_max_s: float
    retention_s: int
    max_body_bytes: int
    paused: bool
    created_at: datetime


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
    delay_s: float = Field(0, ge=0, le=MAX_DELAY_S)


class EdgeOut(BaseModel):
    from_queue: str
    to_queue: str
    map: str | None
    fan_out: str | None
    when_pointer: str | None
    when_equals: Any
    when_present: bool | None
    is_join: bool
    partial: bool
    priority: int | None
    delay_s: float


class GraphOut(BaseModel):
    edges: list[EdgeOut]


class KeyIn(Strict):
    ring: Ring = Field(description="0 admin, 1 operator, 2 worker, 3 observer")
    queues: list[str] = Field(default_factory=lambda: ["*"], min_length=1, description="glob patterns")
    name: str = Field("", max_length=200)


class KeyOut(BaseModel):
    id: int
    name: str
    ring: int
    queues: list[str]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class NewKeyOut(BaseModel):
    key: str = Field(description="shown this once: store it now")
    id: int
    name: str
    ring: int
    queues: list[str]


class KeysOut(BaseModel):
    keys: list[KeyOut]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody
