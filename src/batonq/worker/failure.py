"""What a handler's exception becomes: the error body of ``fail`` (its
message, then its traceback, cut to fit the queue's size limit) and how to
retry."""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from batonq.errors import PermanentError, Retry
from batonq.json_values import json_size
from batonq.limits import MAX_BODY_BYTES

__all__ = ["FailArguments", "failure_of", "fit_text", "message_of"]

_HEAD_CHARS = 2000


@dataclass(frozen=True, slots=True)
class FailArguments:
    """The arguments of ``fail`` for one exception."""

    error: str
    retry_delay_s: float | None = None
    requeue: bool = True


def fit_text(text: str, limit_bytes: int) -> str:
    """``text``, cut in the middle if needed so that as a JSON string it fits
    in ``limit_bytes``: a traceback's start (where) and end (what) survive."""
    text = text.replace("\x00", "\\x00")  # jsonb cannot hold NUL
    size = json_size(text)
    if size <= limit_bytes:
        return text
    keep = len(text) * limit_bytes // size
    while keep > 0:
        head = min(_HEAD_CHARS, keep // 4)
        tail = keep - head
        marker = f"\n[... {len(text) - head - tail} characters cut ...]\n"
        fitted = text[:head] + marker + (text[-tail:] if tail else "")
        if json_size(fitted) <= limit_bytes:
            return fitted
        keep = keep * 9 // 10 - len(marker)
    return ""


def message_of(error: BaseException) -> str:
    """The exception's one-line message, e.g. ``PermanentError: not an address: nobody``."""
    name = type(error).__name__
    text = " ".join(str(error).split())
    return f"{name}: {text}" if text else name


def failure_of(error: BaseException, limit_bytes: int = MAX_BODY_BYTES) -> FailArguments:
    """``Retry``: retry after its delay, with its message as the error.
    ``PermanentError``: dead now. Anything else: the queue's backoff. Both
    of those keep the message, then a blank line and the traceback, as the
    attempt's error: a task's last error reads first what went wrong."""
    if isinstance(error, Retry):
        return FailArguments(fit_text(f"Retry: {error.message}", limit_bytes), retry_delay_s=error.delay_s)
    trace = "".join(traceback.format_exception(error)).rstrip("\n")
    text = f"{message_of(error)}\n\n{trace}"
    return FailArguments(fit_text(text, limit_bytes), requeue=not isinstance(error, PermanentError))
