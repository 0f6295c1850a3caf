"""Rings and queue scopes of API keys, shared by the HTTP service and the MCP
server: a ring-N key may do all that rings N..3 may, on the queues its glob
patterns cover."""

from __future__ import annotations

import re
from collections.abc import Iterable
from fnmatch import fnmatchcase

__all__ = ["ADMIN", "OBSERVER", "OPERATOR", "RINGS", "WORKER", "covers", "scope_regex"]

ADMIN, OPERATOR, WORKER, OBSERVER = 0, 1, 2, 3
RINGS = {ADMIN: "admin", OPERATOR: "operator", WORKER: "worker", OBSERVER: "observer"}


def covers(patterns: Iterable[str], queue: str) -> bool:
    """Whether any of a key's queue patterns (``shop:*``) matches ``queue``."""
    return any(fnmatchcase(queue, pattern) for pattern in patterns)


def scope_regex(pattern: str) -> str:
    """A key's glob pattern as an anchored POSIX regular expression that
    matches the same queue names as ``covers`` (for the engine's reads that
    apply scopes in SQL). ``[`` without its ``]`` is a plain character, as in
    fnmatch."""
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        close = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "]") else i + 1)
        if char == "[" and close != -1:
            body = pattern[i + 1 : close]
            if body.startswith("!"):
                body = "^" + body[1:]
            elif body.startswith("^"):
                body = "\\^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = close + 1
            continue
        out.append(".*" if char == "*" else "." if char == "?" else re.escape(char))
        i += 1
    return "^" + "".join(out) + "$"
