"""Rings and queue scopes of API keys, shared by the HTTP service and the MCP
server: a ring-N key may do all that rings N..3 may, on the queues its glob
patterns cover."""

from __future__ import annotations

import re
from collections.abc import Iterable
from fnmatch import fnmatchcase

__all__ = ["ADMIN", "OBSERVER", "OPERATOR", "RINGS", "WORKER", "contains", "covers", "scope_regex"]

ADMIN, OPERATOR, WORKER, OBSERVER = 0, 1, 2, 3
RINGS = {ADMIN: "admin", OPERATOR: "operator", WORKER: "worker", OBSERVER: "observer"}


def covers(patterns: Iterable[str], queue: str) -> bool:
    """Whether any of a key's queue patterns (``shop:*``) matches ``queue``."""
    return any(fnmatchcase(queue, pattern) for pattern in patterns)


_WILD = frozenset("*?[")


def contains(patterns: Iterable[str], pattern: str) -> bool:
    """Whether every queue name ``pattern`` matches is matched by one of
    ``patterns`` (a key's scopes): so a key made with ``pattern`` reaches
    nothing its maker could not. Decided without enumerating names, and
    only in cases that are plainly right, otherwise refused: ``pattern``
    is inside ``p`` when ``p`` is ``*``; when both are the same text; when
    ``pattern`` is a plain name that ``p`` matches; or when ``p`` is a plain
    prefix and ``*`` (``shop:*``) and ``pattern`` starts with that prefix
    (``shop:eu:*``, ``shop:q?``)."""
    literal = not _WILD.intersection(pattern)
    for p in patterns:
        prefix = p[:-1]
        if p == "*" or p == pattern or (literal and fnmatchcase(pattern, p)):
            return True
        if p.endswith("*") and not _WILD.intersection(prefix) and pattern.startswith(prefix):
            return True
    return False


def scope_regex(pattern: str) -> str:
    """A key's glob pattern as an anchored POSIX regular expression that
    matches the same queue names as ``covers`` does (for the engine's reads
    that apply scopes in SQL). A bracket expression becomes the list of the
    queue-name characters it matches, asked of fnmatch itself; a ``[``
    without its ``]`` is a plain character, as in fnmatch."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        char = pattern[i]
        i += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char != "[":
            out.append(re.escape(char))
        else:
            j = i + 1 if pattern[i : i + 1] == "!" else i  # where fnmatch looks for the closing ]
            j = j + 1 if pattern[j : j + 1] == "]" else j
            j = pattern.find("]", j)
            if j == -1:
                out.append(re.escape("["))
                continue
            members = [c for c in _NAME_CHARS if fnmatchcase(c, pattern[i - 1 : j + 1])]
            # No queue name holds a *: an empty set matches nothing.
            out.append("(" + "|".join(re.escape(c) for c in members) + ")" if members else "\\*")
            i = j + 1
    return "^" + "".join(out) + "$"


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_.:-"
"""The characters of queue names (batonq._valid_queue_name)."""
