"""Errors as ``{"error": {"code", "message", …}}`` with the right status."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from batonq import errors

__all__ = ["ApiError", "install"]

STATUS: dict[type[errors.BatonqError], int] = {
    errors.InvalidQueueName: 400,
    errors.InvalidArgument: 400,
    errors.InvalidToken: 400,
    errors.TaskNotFound: 404,
    errors.QueueNotFound: 404,
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
        detail["task_id"] = f"t_{detail['task_id']}"
    return detail


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(body(error.code, error.message, **error.extra), error.status, error.headers)

    @app.exception_handler(errors.BatonqError)
    async def batonq_error(_: Request, error: errors.BatonqError) -> JSONResponse:
        return JSONResponse(body(error.code, error.message, **_detail(error)), _status_of(error))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = [
            {"at": ".".join(str(p) for p in e.get("loc", ()) if p != "body"), "problem": e.get("msg")}
            for e in error.errors()
        ]
        first = problems[0] if problems else {"at": "", "problem": "invalid request"}
        message = f"{first['at']}: {first['problem']}" if first["at"] else str(first["problem"])
        return JSONResponse(body("invalid_request", message, problems=problems), 422)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        return JSONResponse(body(code, str(error.detail)), error.status_code, error.headers)
