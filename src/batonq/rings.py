"""Rings and queue scopes of API keys, shared by the HTTP service and the MCP
server: a ring-N key may do all that rings N..3 may, on the queues its glob
patterns cover."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

__all__ = ["ADMIN", "OBSERVER", "OPERATOR", "RINGS", "WORKER", "covers", "pattern_regex"]

ADMIN, OPERATOR, WORKER, OBSERVER = 0, 1, 2, 3
RINGS = {ADMIN: "admin", OPERATOR: "operator", WORKER: "worker", OBSERVER: "observer"}


def covers(patterns: Iterable[str], queue: str) -> bool:
    """Whether any of a key's queue patterns (``shop:*``) matches ``queue``."""
    return any(fnmatchcase(queue, pattern) for pattern in patterns)


def pattern_regex(pattern: str) -> str:
    """A queue pattern as an anchored POSIX regular expression (what
    PostgreSQL's ``~`` takes) that matches every name ``covers`` matches:
    exactly, but for a ``[...]`` set, which matches any one character here
    (so filter with ``covers`` as well)."""
    out, i = ["^"], 0
    while i < len(pattern):
        char = pattern[i]
        i += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            # Where fnmatch's set ends: a "!" first negates, a "]" first (or
            # after the "!") is a member; without a closing "]" it is literal.
            j = i + 1 if pattern[i : i + 1] == "!" else i
            j = pattern.find("]", j + 1 if pattern[j : j + 1] == "]" else j)
            if j < 0:
                out.append("\\[")
            else:
                out.append(".")
                i = j + 1
        else:
            out.append(char if char.isalnum() else "\\" + char)
    return "".join(out) + "$"
