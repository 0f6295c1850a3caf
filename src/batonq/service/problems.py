"""Errors as ``{"error": {"code", "message", …}}`` with the right status."""

from __future__ import annotations

from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException
from starlette.routing import Match

from batonq import errors
from batonq.access import Refused
from batonq.models import task_ref
from batonq.schemas import ErrorOut
from batonq.service.body import BodyNotJson, TooManyItems

__all__ = ["ERROR_RESPONSES", "UNAVAILABLE", "ApiError", "body", "install", "unavailable"]

STATUS: dict[type[errors.BatonqError], int] = {
    errors.InvalidQueueName: 400,
    errors.InvalidArgument: 400,
    errors.InvalidToken: 400,
    errors.TaskNotFound: 404,
    errors.QueueNotFound: 404,
    errors.ScheduleNotFound: 404,
    errors.KeyNotFound: 404,
    errors.PayloadTooLarge: 413,
    errors.InvalidState: 409,
    errors.GraphCycle: 409,
    errors.LeaseLost: 409,
    errors.SchemaMissing: 503,
}


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers, extra


def body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def _status_of(error: errors.BatonqError) -> int:
    for cls in type(error).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def _detail(error: errors.BatonqError) -> dict[str, Any]:
    detail = dict(error.detail)
    if "task_id" in detail and isinstance(detail["task_id"], int):
        detail["task_id"] = task_ref(detail['task_id'])
    return detail


_QUEUE_FIELDS = frozenset({"queue", "from_queue", "to_queue"})

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": description}
    for status, description in (
        (
            400,
            "invalid_json, invalid_queue_name, invalid_token, invalid_argument, json_too_deep,"
            " number_too_large",
        ),
        (401, "unauthorized: no key, or an unknown or revoked one"),
        (403, "forbidden: the key's ring or queue scopes do not allow this"),
        (404, "task_not_found and the like (a task outside the key's scopes does not exist)"),
        (409, "lease_lost, invalid_state or graph_cycle"),
        (413, "request_too_large (the whole body), payload_too_large (a payload, result or error),"
              " too_many_items (a list, or a claim's max_tasks, over 1,000) or too_many_queues"
              " (a list enqueue over 100 queues)"),
        (422, "invalid_request: the body or a parameter does not match the schema"),
        (429, "too_many_streams (streams and long-polls open) or too_many_new_queues; see Retry-After"),
    )
}
"""The error answers every /v1 operation may give, for /openapi.json."""


def _where(loc: tuple[Any, ...]) -> str:
    """``queue`` for a body field, ``query.limit`` for a parameter; drops the
    union tags pydantic puts in a location (``EnqueueIn``, ``list[EnqueueIn]``)."""
    kept = [p for p in loc if not (isinstance(p, str) and (p == "body" or p[:1].isupper() or "[" in p))]
    return ".".join(str(p) for p in kept)


def _relevant(error: RequestValidationError) -> list[dict[str, Any]]:
    """The errors of the branch the body took: an object is checked as one
    task, a list as many (pydantic reports both branches of the union)."""
    found = [dict(e) for e in error.errors()]

    def is_list_branch(e: dict[str, Any]) -> bool:
        loc = e.get("loc", ())
        return len(loc) > 1 and loc[0] == "body" and isinstance(loc[1], str) and loc[1].startswith("list[")

    if not any(is_list_branch(e) for e in found):
        return found
    wanted = [e for e in found if is_list_branch(e) == isinstance(error.body, list)]
    return wanted or found


def _problem(e: dict[str, Any]) -> Any:
    """pydantic's message, without the "Value error, " it puts before our own."""
    message = e.get("msg")
    if e.get("type") == "value_error" and isinstance(message, str):
        return message.removeprefix("Value error, ")
    return message


def _is_bad_queue_name(e: dict[str, Any]) -> bool:
    loc = e.get("loc", ())
    return e.get("type") == "string_pattern_mismatch" and bool(loc) and loc[-1] in _QUEUE_FIELDS


async def _api_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return JSONResponse(body(error.code, error.message, **error.extra), error.status, error.headers)


async def _refused(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, Refused)
    return JSONResponse(body(error.code, error.message), error.status, error.headers)


async def _batonq_error(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, errors.BatonqError)
    return JSONResponse(body(error.code, error.message, **_detail(error)), _status_of(error))


async def _invalid(_: Request, error: Exception) -> JSONResponse:
    """Malformed JSON is 400 invalid_json, a bad queue name 400
    invalid_queue_name (as from the engine), anything else 422."""
    assert isinstance(error, RequestValidationError)
    found = _relevant(error)
    for e in found:
        if e.get("type") == "json_invalid":
            reason = (e.get("ctx") or {}).get("error", "")
            return JSONResponse(body("invalid_json", f"the body is not valid JSON: {reason}"), 400)
    problems = [{"at": _where(tuple(e.get("loc", ()))), "problem": _problem(e)} for e in found]
    for e in found:
        if _is_bad_queue_name(e):
            name = e.get("input")
            message = (
                f"invalid queue name {name!r}: use 1-128 characters from a-z 0-9 _ . : - "
                "starting with a letter or digit"
            )
            return JSONResponse(body("invalid_queue_name", message, queue=name, problems=problems), 400)
    first = problems[0] if problems else {"at": "", "problem": "invalid request"}
    # "lease_seconds must be between 1 and 3600 (got 7200)": a range reads as a sentence.
    joint = " " if found and found[0].get("type") == "out_of_range" else ": "
    message = f"{first['at']}{joint}{first['problem']}" if first["at"] else str(first["problem"])
    return JSONResponse(body("invalid_request", message, problems=problems), 422)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _methods(request: Request) -> list[str]:
    """The methods some route takes at this path."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    ]


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    if isinstance(error, BodyNotJson):
        return JSONResponse(body("invalid_json", str(error.detail)), 400)
    if isinstance(error, TooManyItems):
        return JSONResponse(body("too_many_items", str(error.detail)), 413)
    headers = dict(error.headers or {})
    if error.status_code == 405:
        # Starlette names only the first matching route's methods; a path may have several routes.
        headers["Allow"] = ", ".join(_methods(request))
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
    return JSONResponse(body(code, str(error.detail)), error.status_code, headers)


async def _bad_value(_: Request, error: Exception) -> JSONResponse:
    """A value PostgreSQL cannot store: a NUL character in text, \\u0000 in
    JSON, a number out of range."""
    assert isinstance(error, psycopg.DataError)
    message = error.diag.message_primary or str(error)
    return JSONResponse(body("invalid_argument", f"the database refused a value: {message}"), 400)


async def _bad_text(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, UnicodeEncodeError)
    return JSONResponse(body("invalid_argument", f"text that is not valid Unicode: {error.reason}"), 400)


UNAVAILABLE = (psycopg.OperationalError, PoolTimeout)
"""What a call raises while the database is unreachable (or the pool has no connection)."""


def unavailable() -> dict[str, Any]:
    """The body of a 503 while the database is unreachable."""
    return body("unavailable", "the database is unavailable; try again")


async def _unavailable(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse(unavailable(), 503)


async def _crashed(_: Request, error: Exception) -> JSONResponse:
    # Starlette logs the exception as well; the client gets the usual shape.
    return JSONResponse(body("internal_error", "internal server error"), 500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(Refused, _refused)
    app.add_exception_handler(errors.BatonqError, _batonq_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(psycopg.DataError, _bad_value)
    app.add_exception_handler(UnicodeEncodeError, _bad_text)
    for cls in UNAVAILABLE:
        app.add_exception_handler(cls, _unavailable)
    app.add_exception_handler(Exception, _crashed)
