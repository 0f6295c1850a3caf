"""Exceptions, and the one place that maps the engine's SQLSTATEs to them."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg

__all__ = [
    "BatonqError",
    "DirectConnectionNeeded",
    "EmbeddedUnavailable",
    "GraphCycle",
    "InvalidArgument",
    "InvalidQueueName",
    "InvalidState",
    "InvalidToken",
    "JsonTooDeep",
    "KeyNotFound",
    "LeaseLost",
    "NumberTooLarge",
    "PayloadTooLarge",
    "PermanentError",
    "QueueNotFound",
    "Retry",
    "ScheduleNotFound",
    "SchemaMissing",
    "TaskFinished",
    "TaskNotFound",
    "from_database_error",
]


class BatonqError(Exception):
    """Base of every error batonq raises; ``code`` is the stable error code."""

    code = "batonq_error"

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class InvalidQueueName(BatonqError):
    code = "invalid_queue_name"


class TaskNotFound(BatonqError):
    code = "task_not_found"


class PayloadTooLarge(BatonqError):
    """A payload, result or error over the queue's ``max_body_bytes``."""

    code = "payload_too_large"


class InvalidArgument(BatonqError):
    code = "invalid_argument"


class JsonTooDeep(InvalidArgument):
    """A payload, result or error nested deeper than the engine serves back
    (64 levels); ``depth`` and ``limit`` say by how much."""

    code = "json_too_deep"


class NumberTooLarge(InvalidArgument):
    """A JSON number with more than 300 digits before its decimal point
    (1e300 or more): readers could not load it; ``digits`` and ``limit``."""

    code = "number_too_large"


class InvalidToken(BatonqError):
    """A lease token that is malformed or does not match its task's lease."""

    code = "invalid_token"


class QueueNotFound(BatonqError):
    code = "queue_not_found"


class InvalidState(BatonqError):
    """An operator action on a task in the wrong state (e.g. retry a done task)."""

    code = "invalid_state"


class GraphCycle(BatonqError):
    """An edge that would close a cycle in the queue graph; ``cycle`` names it."""

    code = "graph_cycle"


class KeyNotFound(BatonqError):
    code = "key_not_found"


class ScheduleNotFound(BatonqError):
    """No schedule of that name; ``schedule`` names it."""

    code = "schedule_not_found"


class SchemaMissing(BatonqError):
    code = "schema_missing"


class EmbeddedUnavailable(BatonqError):
    """The embedded PostgreSQL cannot run safely where it was asked to
    (``$BATONQ_HOME`` too long for its socket, or out of its user's reach)."""

    code = "embedded_unavailable"


class DirectConnectionNeeded(BatonqError):
    """LISTEN was asked for, but the database URL goes through a transaction
    pooler and no URL straight to PostgreSQL was given: raised at open."""

    code = "direct_connection_needed"


class LeaseLost(BatonqError):
    """The lease is no longer held: the write was refused and set aside.

    ``state`` is the task's current state and ``current_fencing_token`` its
    newest token; drop the result, another holder (or an operator) has it.
    """

    code = "lease_lost"

    def __init__(
        self, task_id: int, state: str, fencing_token: int, current_fencing_token: int | None
    ) -> None:
        super().__init__(
            f"lease no longer held: task t_{task_id} is {state}"
            + (
                f" under fencing token {current_fencing_token} (yours is {fencing_token})"
                if current_fencing_token != fencing_token
                else ""
            ),
            task_id=task_id,
            state=state,
            fencing_token=fencing_token,
            current_fencing_token=current_fencing_token,
        )
        self.task_id = task_id
        self.state = state
        self.fencing_token = fencing_token
        self.current_fencing_token = current_fencing_token


class TaskFinished(LeaseLost):
    """The lease is no longer held because the task is done, dead or cancelled."""


class PermanentError(BatonqError):
    """Raise from a handler to fail its task for good: dead now, no retry.

    Usage: ``raise batonq.PermanentError("order 17 does not exist")``
    """

    code = "permanent_error"


class Retry(BatonqError):
    """Raise from a handler to retry its task after ``delay_s`` seconds.

    ``delay_s=None`` uses the queue's exponential backoff. The attempt still
    counts: past ``max_attempts`` the task is dead.

    Usage: ``raise batonq.Retry(delay_s=30, message="rate limited")``
    """

    code = "retry"

    def __init__(self, delay_s: float | None = None, message: str = "retry requested") -> None:
        if delay_s is not None and delay_s < 0:
            raise ValueError("delay_s must be at least 0")
        super().__init__(message, delay_s=delay_s)
        self.delay_s = delay_s


_BY_SQLSTATE: dict[str, type[BatonqError]] = {
    "BQ001": InvalidQueueName,
    "BQ002": TaskNotFound,
    "BQ003": PayloadTooLarge,
    "BQ004": InvalidArgument,
    "BQ005": InvalidToken,
    "BQ006": QueueNotFound,
    "BQ007": InvalidState,
    "BQ008": GraphCycle,
    "BQ009": KeyNotFound,
    "BQ010": JsonTooDeep,
    "BQ011": NumberTooLarge,
    "BQ012": ScheduleNotFound,
}


_MAX_INT = 2**31 - 1
_INFINITE = re.compile(r'Token "-?Infinity" is invalid')


def _refused_value(error: psycopg.Error, sqlstate: str) -> BatonqError | None:
    """What is wrong with a value the driver or PostgreSQL cannot take at
    all (before the engine sees it), as the batonq error a user can act on."""
    detail = error.diag.message_detail or ""
    if sqlstate == "22P02" and "JSON" in (error.diag.context or ""):
        # json.dumps writes float('inf') and float('nan'), which JSON has not.
        if _INFINITE.search(detail):
            return NumberTooLarge(
                "a JSON value holds an infinite number (Infinity): numbers must be under 1e300",
                limit=300,
            )
        if 'Token "NaN"' in detail:
            return InvalidArgument("a JSON value holds NaN, which JSON has no way to write: use null")
    if sqlstate == "22P05" and "\\u0000" in detail:
        return InvalidArgument("a JSON value holds a NUL character (\\u0000), which PostgreSQL cannot store")
    if not sqlstate and isinstance(error, psycopg.DataError) and "NUL" in str(error):
        return InvalidArgument("a text argument holds a NUL character (\\x00), which PostgreSQL cannot store")
    types = error.diag.message_primary or ""
    if sqlstate == "42883" and re.search(r"\b(bigint|numeric)\b", types) and not re.search(
        r"\b(boolean|double precision)\b", types
    ):
        # psycopg sends an int past 32 bits as bigint: no function takes it.
        return InvalidArgument(f"a number is out of range: counts and limits are at most {_MAX_INT}")
    return None


def from_database_error(error: psycopg.Error) -> Exception:
    """The batonq exception for an engine error, or ``error`` itself."""
    sqlstate = error.sqlstate or ""
    cls = _BY_SQLSTATE.get(sqlstate)
    if cls is not None:
        detail: dict[str, Any] = {}
        raw = error.diag.message_detail
        if raw:
            try:
                detail = json.loads(raw)
            except ValueError:
                detail = {"detail": raw}
        return cls(error.diag.message_primary or str(error), **detail)
    refused = _refused_value(error, sqlstate)
    if refused is not None:
        return refused
    if sqlstate == "42883" and "batonq" in str(error):
        # No function of that name takes arguments of these types: an
        # argument of the wrong Python type, or a schema older than the code.
        return SchemaMissing(
            f"{error.diag.message_primary}: check the arguments' types (an int, not a bool or a float),"
            " or run `batonq migrate` if this database's batonq schema is older than batonq"
        )
    if sqlstate in ("3F000", "42P01") and "batonq" in str(error):
        return SchemaMissing(
            "the batonq schema is missing or out of date in this database: run `batonq migrate`"
        )
    return error
