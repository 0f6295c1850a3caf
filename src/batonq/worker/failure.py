"""What a handler's exception becomes: the error body of ``fail`` (its
message, then its traceback, cut to fit the queue's size limit) and how to
retry."""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass

from batonq.errors import PermanentError, Retry

__all__ = ["DEFAULT_LIMIT_BYTES", "Failure", "failure_of", "fit_text", "json_size", "json_text"]

DEFAULT_LIMIT_BYTES = 131072
"""A queue's default ``max_body_bytes``: payload, result and error each."""

_HEAD_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Failure:
    """The arguments of ``fail`` for one exception."""

    error: str
    retry_delay_s: float | None = None
    requeue: bool = True


# One encoder, made once: json.dumps with any non-default option makes a new
# encoder at every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def json_text(value: object) -> str:
    """``value`` as JSON text; TypeError or ValueError if JSON cannot hold it."""
    if value is None:  # what most handlers return: spares the encoder's set-up per job
        return "null"
    return _ENCODER.encode(value)


def json_size(value: object) -> int:
    """The bytes ``value`` takes as JSON text, as the engine measures it."""
    return len(json_text(value).encode())


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


def failure_of(error: BaseException, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> Failure:
    """``Retry``: retry after its delay, with its message as the error.
    ``PermanentError``: dead now. Anything else: the queue's backoff. Both
    of those keep the message, then a blank line and the traceback, as the
    attempt's error: a task's last error reads first what went wrong."""
    if isinstance(error, Retry):
        return Failure(fit_text(f"Retry: {error.message}", limit_bytes), retry_delay_s=error.delay_s)
    trace = "".join(traceback.format_exception(error)).rstrip("\n")
    text = f"{message_of(error)}\n\n{trace}"
    return Failure(fit_text(text, limit_bytes), requeue=not isinstance(error, PermanentError))
