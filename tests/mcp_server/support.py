"""Reaching batonq's MCP server the way agents do: the SDK's own client, over
stdio (a ``batonq mcp`` process per session) or streamable HTTP (a real
``batonq serve`` process)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import anyio
import httpx
import httpx2
import psycopg
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Request, RequestParams, Result, TextContent
from pydantic import TypeAdapter
from tests.waiting import wait_for

from batonq.client import ENV_LISTEN_DSN

BATONQ = str(Path(sys.executable).parent / "batonq")
WRITE_TOOLS = {
    "batonq_enqueue",
    "batonq_claim",
    "batonq_heartbeat",
    "batonq_complete",
    "batonq_fail",
    "batonq_run",
    "batonq_schedule",
}
READ_TOOLS = {"batonq_tasks", "batonq_queues"}


def mcp_process(dsn: str, *args: str) -> StdioServerParameters:
    """``batonq --dsn DSN mcp ARGS``, with $BATONQ_LISTEN_URL when the test
    set it (behind PgBouncer): the SDK passes a process only a few
    variables of its environment."""
    listen = {ENV_LISTEN_DSN: os.environ[ENV_LISTEN_DSN]} if ENV_LISTEN_DSN in os.environ else {}
    return StdioServerParameters(
        command=BATONQ, args=["--dsn", dsn, "mcp", *args], env={**get_default_environment(), **listen}
    )


@contextlib.asynccontextmanager
async def stdio_session(dsn: str, *args: str) -> AsyncIterator[ClientSession]:
    """A session with its own ``batonq --dsn DSN mcp ARGS`` process."""
    params = mcp_process(dsn, *args)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_session(url: str, key: str | None) -> AsyncIterator[ClientSession]:
    """A session over streamable HTTP, presenting ``key`` as a Bearer key."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its structured reply."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} failed: {text(result)}"
    assert result.structured_content is not None
    # The text copy is the same JSON: nothing spliced into prose.
    assert json.loads(text(result)) == result.structured_content
    return result.structured_content


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """Call a tool that must fail; its error text."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, f"{tool} should have failed: {result.structured_content}"
    return text(result)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_key(dsn: str, ring: int, queues: str = "*") -> str:
    """``batonq keys create``: the key on stdout."""
    made = subprocess.run(
        [BATONQ, "--dsn", dsn, "keys", "create", "--ring", str(ring), "--queues", queues],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return made.stdout.strip()


@dataclass
class Service:
    """A ``batonq serve`` process on a free port; ``admin_key`` is the first
    key it printed on stderr."""

    dsn: str
    log: IO[str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    admin_key: str = ""
    args: tuple[str, ...] = ()
    """More ``batonq serve`` options."""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def start(self) -> Service:
        self.proc = subprocess.Popen(
            [BATONQ, "--dsn", self.dsn, "serve", "--port", str(self.port), "--log-level", "warning",
             *self.args],
            stdout=subprocess.DEVNULL, stderr=self.log,
        )  # fmt: skip
        self.admin_key = wait_for(self._printed_key, timeout=60, what="the first admin key on stderr")
        wait_for(self._healthy, timeout=60, what="batonq serve answering /healthz")
        return self

    def _printed_key(self) -> str | None:
        assert self.proc is not None
        assert self.proc.poll() is None, Path(self.log.name).read_text()
        found = re.search(r"bq_[0-9]+_[0-9a-f]{64}", Path(self.log.name).read_text())
        return found[0] if found else None

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def running_service(dsn: str, log_path: Path, *args: str) -> Iterator[Service]:
    with log_path.open("w") as log:
        service = Service(dsn, log, args=args)
        try:
            yield service.start()
        finally:
            service.stop()


def counts_in_database(sql: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    """Tasks per state, straight from the tables; claimable and scheduled
    pending tasks apart, as batonq_tasks reports them."""
    rows = sql.execute(
        """SELECT CASE WHEN state = 'pending' AND run_at > now() THEN 'scheduled' ELSE state END, count(*)
             FROM batonq.tasks WHERE queue = %(q)s GROUP BY 1
           UNION ALL
           SELECT state, count(*) FROM batonq.archive WHERE queue = %(q)s GROUP BY 1""",
        {"q": queue},
    ).fetchall()
    counts = dict.fromkeys(
        ("waiting", "held", "pending", "scheduled", "leased", "done", "dead", "cancelled"), 0
    )
    counts.update({state: int(n) for state, n in rows})
    return counts


@dataclass
class Target:
    """Where a test's MCP sessions go: ``stdio`` (one ``batonq mcp`` process
    per session, on the worker role's DSN) or ``http`` (one ``batonq serve``,
    with a ring 2 and a ring 3 key made by ``batonq keys create``)."""

    kind: str
    dsn: str
    service: Service | None = None
    worker_key: str = ""
    observer_key: str = ""

    def session(self, *, read_only: bool = False) -> contextlib.AbstractAsyncContextManager[ClientSession]:
        if self.service is None:
            return stdio_session(self.dsn, *(["--read-only"] if read_only else []))
        return http_session(self.service.url, self.observer_key if read_only else self.worker_key)


TASKS = "io.modelcontextprotocol/tasks"


class TaskHandle(Result):
    """A task as the tasks extension shows it: the answer to a tool call
    (``resultType: "task"``) and to ``tasks/get``."""

    result_type: str
    task_id: str
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class CreatedTask(TaskHandle):
    result_type: Literal["task"]


class TaskIdParams(RequestParams):
    task_id: str


class TaskRequest(Request[TaskIdParams, str]):
    """tasks/get, tasks/update or tasks/cancel, with the task id as its Mcp-Name."""

    name_param = "taskId"


async def task_request(session: ClientSession, method: str, task_id: str) -> dict[str, Any]:
    """A tasks/* request; its raw result."""
    request = TaskRequest(method=method, params=TaskIdParams(task_id=task_id))
    answer: dict[str, Any] = await session.send_request(request, TypeAdapter(dict[str, Any]))
    return answer


async def task_get(session: ClientSession, task_id: str) -> TaskHandle:
    return TaskHandle.model_validate(await task_request(session, "tasks/get", task_id))


async def task_until(session: ClientSession, task_id: str, status: str, timeout: float = 30) -> TaskHandle:
    """Poll tasks/get, at the interval the task asks for, until ``status``."""
    deadline = time.monotonic() + timeout
    while (task := await task_get(session, task_id)).status != status:
        assert time.monotonic() < deadline, f"{task_id} still {task.status}, not {status}"
        await anyio.sleep((task.poll_interval_ms or 1000) / 1000)
    return task


class TasksClient(ClientExtension):
    """A client of the tasks extension: a tool call answered with a task is
    followed with tasks/get until it ends, and answers as the tool would."""

    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.follow)]

    async def follow(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        deadline = time.monotonic() + 60
        task: TaskHandle = created
        while task.status == "working":
            assert time.monotonic() < deadline, f"{task.task_id} still working"
            await anyio.sleep((task.poll_interval_ms or 1000) / 1000)
            task = await task_get(ctx.session, task.task_id)
        if task.status != "completed":
            raise RuntimeError(f"task {task.task_id} {task.status}: {task.error}")
        return CallToolResult.model_validate(task.result)


@contextlib.asynccontextmanager
async def tasks_client(server: str | StdioServerParameters, key: str | None = None) -> AsyncIterator[Client]:
    """A client that speaks the tasks extension (and the newest protocol), to a
    ``batonq serve`` at ``server`` (its /mcp URL) or a ``batonq mcp`` process."""
    if isinstance(server, StdioServerParameters):
        async with Client(server, extensions=[TasksClient()]) as client:
            yield client
        return
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(streamable_http_client(server, http_client=http), extensions=[TasksClient()]) as client,
    ):
        yield client
