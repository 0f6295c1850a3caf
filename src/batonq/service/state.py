"""What a request finds on its app: the process's clients and metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request

from batonq.client import AsyncClient
from batonq.service.metrics import Metrics

if TYPE_CHECKING:
    from batonq.access import NewQueues, OpenPerKey

__all__ = ["client_of", "metrics_of", "new_queues", "open_per_key", "reader_of"]


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
