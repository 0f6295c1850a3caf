"""batonq: a task queue in PostgreSQL that hands each task to exactly one worker.

Usage::

    import batonq

    with batonq.connect() as client:
        client.enqueue("shop:tasks", {"order": 17}, key="order-17")
        for lease in client.claim("shop:tasks", wait_s=5):
            client.complete(lease.lease_token, {"shipped": True})
"""

from batonq.client import AsyncClient, connect_async
from batonq.client_sync import Client, connect
from batonq.errors import (
    BatonqError,
    GraphCycle,
    InvalidArgument,
    InvalidQueueName,
    InvalidState,
    InvalidToken,
    LeaseLost,
    PayloadTooLarge,
    QueueNotFound,
    SchemaMissing,
    TaskFinished,
    TaskNotFound,
)
from batonq.migrate import migrate
from batonq.models import Edge, Enqueued, Lease, QueueConfig, QueueStats, RunStatus, Submitted, Task
from batonq.sweeper import Sweeper

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "BatonqError",
    "Client",
    "Edge",
    "Enqueued",
    "GraphCycle",
    "InvalidArgument",
    "InvalidQueueName",
    "InvalidState",
    "InvalidToken",
    "Lease",
    "LeaseLost",
    "PayloadTooLarge",
    "QueueConfig",
    "QueueNotFound",
    "QueueStats",
    "RunStatus",
    "SchemaMissing",
    "Submitted",
    "Sweeper",
    "Task",
    "TaskFinished",
    "TaskNotFound",
    "__version__",
    "connect",
    "connect_async",
    "migrate",
]
