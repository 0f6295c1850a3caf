"""The engine's limits, written once for Python.

The SQL checks each limit itself; Python restates it to refuse early with a
helpful message (the worker's registration, the CLI's options, the HTTP and
MCP schemas). ``tests/integration/test_limits.py`` reads the SQL's own values
back from the database (constraints, functions, what the edges accept) and
checks that these match them.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_AWAIT_S",
    "MAX_BODY_BYTES",
    "MAX_CLAIM_TASKS",
    "MAX_DELAY_S",
    "MAX_GROUP_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_LEASE_S",
    "MAX_LIST_ITEMS",
    "MAX_NUMBER_DIGITS",
    "MAX_PAGE",
    "MAX_QUEUES_PER_LIST",
    "MAX_QUEUE_BODY_BYTES",
    "MAX_RATE_PERIOD_S",
    "MAX_WAIT_S",
    "MIN_LEASE_S",
    "MIN_RATE_PERIOD_S",
    "QUEUE_NAME",
    "QUEUE_NAME_PATTERN",
]

QUEUE_NAME_PATTERN: Final = r"^[a-z0-9][a-z0-9_.:-]{0,127}$"
"""A queue's name (``batonq._valid_queue_name``)."""
QUEUE_NAME: Final = re.compile(QUEUE_NAME_PATTERN)
"""Use ``fullmatch``: in Python, ``$`` also matches before a final newline."""

MIN_LEASE_S: Final = 1
MAX_LEASE_S: Final = 3600
"""A lease's seconds, claim or heartbeat, and a queue's default lease."""
MAX_ATTEMPTS: Final = 1000
"""A task's or queue's ``max_attempts`` is 1 to this."""
MAX_DELAY_S: Final = 315360000
"""Ten years: the longest delay or retry delay."""
MAX_AWAIT_S: Final = 3600
"""The longest ``batonq.await_work`` waits for (its ``for_s``)."""
MAX_CLAIM_TASKS: Final = 10000
"""The most tasks one engine claim takes."""
MAX_PAGE: Final = 1000
"""The most tasks one listing returns."""
MAX_GROUP_LENGTH: Final = 128
"""A task's group (``enqueue(group=...)``) is 1 to this many characters."""
MIN_RATE_PERIOD_S: Final = 0.001
MAX_RATE_PERIOD_S: Final = 86400
"""A queue's ``rate_period_s`` is from a millisecond to a day."""

MAX_BODY_BYTES: Final = 131072
"""A queue's default ``max_body_bytes`` (128 KiB): payload, result and error
each, as compact JSON text; also the limit of an edge's ``equals``."""
MAX_QUEUE_BODY_BYTES: Final = 104857600
"""The most a queue's ``max_body_bytes`` may be set to (100 MiB)."""
MAX_JSON_DEPTH: Final = 64
"""How deep a payload, result or error may nest."""
MAX_NUMBER_DIGITS: Final = 300
"""Digits before a number's decimal point: no number of 1e300 or more."""

# The edges' own limits: no SQL holds these.
MAX_WAIT_S: Final = 55
"""The longest a claim waits for work: inside an MCP client's usual tool
timeout of 60 s."""
MAX_LIST_ITEMS: Final = 1000
"""The most items one list request (enqueue, claim, submit) may hold."""
MAX_QUEUES_PER_LIST: Final = 100
"""The most queues one list enqueue may name (each new one is created)."""
