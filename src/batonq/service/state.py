"""What a request finds on its app: the process's clients and metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

from batonq.client import AsyncClient
from batonq.service.metrics import Metrics

if TYPE_CHECKING:
    from batonq.access import FailedAuth, NewQueues, OpenPerKey

__all__ = ["address_of", "client_of", "failed_auth", "metrics_of", "new_queues", "open_per_key", "reader_of"]


def client_of(request: Request) -> AsyncClient:
    """The primary: every write, claim, wait and key check."""
    client: AsyncClient = request.app.state.client
    return client


def reader_of(request: Request) -> AsyncClient:
    """Where listings and counts are read: the replica at ``--read-url``,
    else the primary. It may lag the primary."""
    reader: AsyncClient = request.app.state.reader
    return reader


def metrics_of(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


def open_per_key(request: Request) -> OpenPerKey:
    """The long-lived requests each key has open in this process, on every
    door (``batonq.access.OpenPerKey``)."""
    counter: OpenPerKey = request.app.state.open_per_key
    return counter


def new_queues(request: Request) -> NewQueues:
    """The queues each key has created lately, through this process."""
    made: NewQueues = request.app.state.new_queues
    return made


def failed_auth(request: Request) -> FailedAuth:
    """Failed key checks per client address, the API's and the dashboard's sign-ins alike."""
    failed: FailedAuth = request.app.state.failed_auth
    return failed


def address_of(request: Request) -> str:
    """The client's address, as failed key checks are counted by."""
    return request.client.host if request.client else ""
