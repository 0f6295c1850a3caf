"""What a request finds on its app: the process's one client and metrics."""

from __future__ import annotations

from fastapi import Request

from batonq.client import AsyncClient
from batonq.service.metrics import Metrics

__all__ = ["client_of", "metrics_of"]


def client_of(request: Request) -> AsyncClient:
    client: AsyncClient = request.app.state.client
    return client


def metrics_of(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics
