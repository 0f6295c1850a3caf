"""MCP tasks (the ``io.modelcontextprotocol/tasks`` extension): a tool call
answered with a task handle that the client polls, here a batonq task.

When a client that declares the extension calls ``batonq_run``, the answer is
a task whose ``taskId`` is the batonq task id (``t_12``) and whose status
follows the batonq task: waiting, held, pending and leased are ``working``;
done is ``completed`` with the tool's answer (the task and its result); dead
is ``failed`` with the task's last error; cancelled is ``cancelled``. The task
is committed before the handle is sent, so ``tasks/get`` finds it at once,
from any session and any ``batonq mcp`` or ``batonq serve`` process.

A handle is bound to the caller's authorisation the way every read is: a key
whose queue scopes do not cover the task's queue gets "not found", word for
word the answer for an id nobody has. ``tasks/cancel`` cancels the batonq
task, which is an operator's action (ring 1 or stronger), and cooperative: a
worker holding it learns at its next heartbeat or submit ("lease no longer
held").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams, CallToolResult, RequestParams
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from batonq import errors
from batonq.access import Refused, admit
from batonq.mcp.caller import Caller, find_caller
from batonq.models import Task, task_ref
from batonq.rings import RINGS
from batonq.schemas import TaskOut

__all__ = ["EXTENSION", "POLL_INTERVAL_MS", "Tasks", "handle", "speaks_tasks"]

EXTENSION = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS = 1000
"""What a client is asked to wait between two tasks/get."""

_WORKING = {
    "waiting": "waiting for the tasks it joins to finish",
    "held": "held by an operator: not claimable until released",
    "pending": "pending: waiting for a worker to claim it",
    "leased": "leased: a worker is on it",
}


def speaks_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the tasks extension, on a
    protocol revision that can carry a task handle (2026-07-28 and later)."""
    capabilities = ctx.session.client_capabilities
    declared = capabilities.extensions if capabilities is not None else None
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and EXTENSION in (declared or {})


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] | None = None


def handle(task: Task, answer: Callable[[TaskOut], CallToolResult], result_type: str) -> dict[str, Any]:
    """The MCP task for a batonq task. ``answer`` makes the tool's answer
    for a finished task (what a completed task carries)."""
    out = TaskOut.of(task)
    updated = max(t for t in (task.created_at, task.claimed_at, task.finished_at) if t is not None)
    shown: dict[str, Any] = {
        "resultType": result_type,
        "taskId": task_ref(task.id),
        "createdAt": task.created_at.isoformat(),
        "lastUpdatedAt": updated.isoformat(),
        # Kept as long as the queue's retention keeps finished tasks: no fixed ttl.
        "ttlMs": None,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if task.state == "done":
        result = answer(out).model_dump(by_alias=True, mode="json", exclude_none=True)
        shown.update(status="completed", statusMessage=f"done after {_attempts(task)}", result=result)
    elif task.state == "dead":
        error = {"code": INTERNAL_ERROR, "message": task.last_error or "dead"}
        error["data"] = out.model_dump(mode="json")
        shown.update(status="failed", statusMessage=f"dead after {_attempts(task)}", error=error)
    elif task.state == "cancelled":
        shown.update(status="cancelled", statusMessage="cancelled")
    elif task.state == "pending" and task.attempts > 0:
        shown.update(status="working", statusMessage=f"pending: to be retried after {_attempts(task)}")
    else:
        shown.update(status="working", statusMessage=_WORKING[task.state])
    return shown


def _attempts(task: Task) -> str:
    return f"{task.attempts} attempt{'' if task.attempts == 1 else 's'}"


class Tasks(Extension):
    """The tasks extension, for the tool ``tool`` (batonq_run); ``answer``
    turns a task into that tool's answer."""

    identifier = EXTENSION

    def __init__(self, tool: str, answer: Callable[[TaskOut], CallToolResult]) -> None:
        self.tool, self.answer = tool, answer

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding(method="tasks/get", params_type=TaskParams, handler=self._get),
            MethodBinding(method="tasks/update", params_type=UpdateParams, handler=self._update),
            MethodBinding(method="tasks/cancel", params_type=TaskParams, handler=self._cancel),
        )

    async def intercept_tool_call(
        self, params: CallToolRequestParams, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        result = await call_next(ctx)
        if params.name != self.tool or not isinstance(result, CallToolResult) or result.is_error:
            return result
        if not speaks_tasks(ctx):
            return result
        # The tool's answer is the task as the enqueue committed it.
        task_id = str(TaskOut.model_validate(result.structured_content).model_dump()["task_id"])
        return handle(await _visible(ctx, task_id), self.answer, "task")

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        require_client_extension(ctx, EXTENSION)
        return handle(await _visible(ctx, params.task_id), self.answer, "complete")

    async def _update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> HandlerResult:
        """batonq tasks never ask the client for input: nothing to take."""
        require_client_extension(ctx, EXTENSION)
        await _visible(ctx, params.task_id)
        return {}

    async def _cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        require_client_extension(ctx, EXTENSION)
        task = await _visible(ctx, params.task_id)
        caller = _caller(ctx)
        try:
            admit(caller.access, "mcp tasks/cancel")
        except Refused:
            raise MCPError(
                code=INVALID_REQUEST,
                message=f"forbidden: cancelling a task needs a key of ring 1 (operator) or stronger; "
                f"this one is ring {caller.access.ring} ({RINGS.get(caller.access.ring, '?')})",
            ) from None
        try:
            await caller.client.cancel(task.id)
        except errors.InvalidState:
            pass  # finished meanwhile: it stays what it became, as the extension allows
        except psycopg.errors.InsufficientPrivilege as error:
            raise MCPError(
                code=INVALID_REQUEST,
                message="forbidden: this server's database role may not cancel tasks (operator actions "
                "need the batonq schema's owner)",
            ) from error
        except errors.BatonqError as error:
            raise MCPError(code=INTERNAL_ERROR, message=f"{error.code}: {error.message}") from error
        return {}


def _caller(ctx: ServerRequestContext[Any, Any]) -> Caller:
    caller = find_caller(ctx)
    if caller is None:
        raise MCPError(code=INVALID_REQUEST, message="unauthorized: no batonq access on this connection")
    return caller


async def _visible(ctx: ServerRequestContext[Any, Any], task_id: str) -> Task:
    """The task, if the caller's keys cover its queue; otherwise not found."""
    caller = _caller(ctx)
    try:
        task = await caller.client.task(task_id)
    except (errors.TaskNotFound, errors.InvalidArgument):
        task = None
    except errors.BatonqError as error:
        raise MCPError(code=INTERNAL_ERROR, message=f"{error.code}: {error.message}") from error
    if task is None or not caller.access.covers(task.queue):
        raise MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: task {task_id} not found")
    return task
