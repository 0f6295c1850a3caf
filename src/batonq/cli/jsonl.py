"""Reading tasks from a JSON Lines file for ``batonq enqueue --from``.

Each non-blank line is one object::

    {"payload": <any JSON>, "key": "shard-07", "priority": 5, "delay_s": 30, "group": "customer-42"}

Only ``payload`` is required. A line without ``"key"`` gets the key
``<prefix>:<line number>`` (the prefix defaults to the file's name), so running
the same import again enqueues only what is not there yet; ``"key": null``
asks for no key. Blank lines are skipped but still counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from batonq.limits import MAX_GROUP_LENGTH
from batonq.models import JSON

__all__ = ["BadLine", "Line", "batches", "read_lines"]

FIELDS = frozenset({"payload", "key", "priority", "delay_s", "group"})


class BadLine(ValueError):
    """A line that is not a valid task; ``number`` counts from 1."""

    def __init__(self, number: int, reason: str) -> None:
        super().__init__(f"line {number}: {reason}")
        self.number = number
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Line:
    """One task to enqueue, with the line it came from and its size in bytes."""

    number: int
    payload: JSON
    key: str | None
    priority: int
    delay_s: float
    group: str | None
    size: int


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_line(
    raw: bytes, number: int, *, key_prefix: str | None, priority: int, delay_s: float, group: str | None
) -> Line | None:
    """The task on one line, None for a blank line; raises ``BadLine``.

    ``key_prefix`` None means lines without "key" get no key; ``priority``,
    ``delay_s`` and ``group`` are used where the line gives none.
    """
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as error:
        raise BadLine(number, f"not UTF-8 ({error.reason} at byte {error.start})") from None
    if not text.strip():
        return None
    try:
        item = json.loads(text)
    except ValueError as error:
        raise BadLine(number, f"not valid JSON: {error}") from None
    if not isinstance(item, dict):
        raise BadLine(number, 'expected an object like {"payload": ...}')
    unknown = sorted(set(item) - FIELDS)
    if unknown:
        raise BadLine(number, f"unknown field {unknown[0]!r} (fields: {', '.join(sorted(FIELDS))})")
    if "payload" not in item:
        raise BadLine(number, 'missing "payload"')
    key = item.get("key", f"{key_prefix}:{number}" if key_prefix is not None else None)
    if key is not None and (not isinstance(key, str) or not key):
        raise BadLine(number, '"key" must be a non-empty string or null')
    line_priority = item.get("priority", priority)
    if not _is_int(line_priority):
        raise BadLine(number, '"priority" must be an integer')
    line_delay = item.get("delay_s", delay_s)
    if not (_is_int(line_delay) or isinstance(line_delay, float)):
        raise BadLine(number, '"delay_s" must be a number of seconds')
    line_group = item.get("group", group)
    valid_group = isinstance(line_group, str) and 1 <= len(line_group) <= MAX_GROUP_LENGTH
    if line_group is not None and not valid_group:
        raise BadLine(number, f'"group" must be a string of 1-{MAX_GROUP_LENGTH} characters, or null')
    return Line(number, item["payload"], key, line_priority, float(line_delay), line_group, len(raw))


def read_lines(
    stream: IO[bytes],
    *,
    key_prefix: str | None,
    priority: int = 0,
    delay_s: float = 0.0,
    group: str | None = None,
) -> Iterator[Line]:
    """The tasks of a stream, in order; raises ``BadLine`` at the first bad one."""
    for number, raw in enumerate(stream, start=1):
        line = parse_line(
            raw, number, key_prefix=key_prefix, priority=priority, delay_s=delay_s, group=group
        )
        if line is not None:
            yield line


def batches(lines: Iterable[Line], size: int) -> Iterator[list[Line]]:
    """Lists of up to ``size`` lines; a bad line raises before its batch is
    yielded, so no part of that batch is enqueued."""
    batch: list[Line] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
