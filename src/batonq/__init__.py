"""batonq: a task queue in PostgreSQL that hands each task to exactly one worker.

Usage::

    import batonq

    with batonq.connect() as client:
        client.enqueue("shop:tasks", {"order": 17}, idempotency_key="order-17")
        for lease in client.claim("shop:tasks", wait_s=5):
            client.complete(lease.lease_token, {"shipped": True})
"""

from batonq.client import AsyncClient, connect_async
from batonq.client_sync import Client, connect
from batonq.errors import (
    BatonqError,
    DirectConnectionNeeded,
    EmbeddedUnavailable,
    GraphCycle,
    InvalidArgument,
    InvalidQueueName,
    InvalidState,
    InvalidToken,
    JsonTooDeep,
    KeyNotFound,
    LeaseLost,
    NumberTooLarge,
    PayloadTooLarge,
    PermanentError,
    QueueNotFound,
    Retry,
    ScheduleNotFound,
    SchemaMissing,
    TaskFinished,
    TaskNotFound,
)
from batonq.migrate import migrate
from batonq.models import (
    AuditEntry,
    Edge,
    Enqueued,
    Lease,
    QueueConfig,
    QueueStats,
    RunStatus,
    Schedule,
    ScheduleFiring,
    SetAsideWrite,
    Submitted,
    Task,
)
from batonq.sweeper import Sweeper
from batonq.version import VERSION
from batonq.worker import App, AsyncJob, BaseJob, Job, Middleware, Outcome, Worker

__version__ = VERSION

__all__ = [
    "App",
    "AsyncClient",
    "AsyncJob",
    "AuditEntry",
    "BaseJob",
    "BatonqError",
    "Client",
    "DirectConnectionNeeded",
    "Edge",
    "EmbeddedUnavailable",
    "Enqueued",
    "GraphCycle",
    "InvalidArgument",
    "InvalidQueueName",
    "InvalidState",
    "InvalidToken",
    "Job",
    "JsonTooDeep",
    "KeyNotFound",
    "Lease",
    "LeaseLost",
    "Middleware",
    "NumberTooLarge",
    "Outcome",
    "PayloadTooLarge",
    "PermanentError",
    "QueueConfig",
    "QueueNotFound",
    "QueueStats",
    "Retry",
    "RunStatus",
    "Schedule",
    "ScheduleFiring",
    "ScheduleNotFound",
    "SchemaMissing",
    "SetAsideWrite",
    "Submitted",
    "Sweeper",
    "Task",
    "TaskFinished",
    "TaskNotFound",
    "Worker",
    "__version__",
    "connect",
    "connect_async",
    "migrate",
]
