"""Rings and queue scopes of API keys, shared by the HTTP service and the MCP
server: a ring-N key may do all that rings N..3 may, on the queues its glob
patterns cover."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

__all__ = ["ADMIN", "OBSERVER", "OPERATOR", "RINGS", "WORKER", "covers"]

ADMIN, OPERATOR, WORKER, OBSERVER = 0, 1, 2, 3
RINGS = {ADMIN: "admin", OPERATOR: "operator", WORKER: "worker", OBSERVER: "observer"}


def covers(patterns: Iterable[str], queue: str) -> bool:
    """Whether any of a key's queue patterns (``shop:*``) matches ``queue``."""
    return any(fnmatchcase(queue, pattern) for pattern in patterns)
