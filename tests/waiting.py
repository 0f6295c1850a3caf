"""Polling with a deadline: the tests' only way to wait for something."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], *, timeout: float, every: float = 0.05, what: str = "") -> T:
    """Call ``check`` until it returns something truthy, and return that;
    fail the test when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what or check}")
        time.sleep(every)
