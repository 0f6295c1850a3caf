"""MCP tasks (the io.modelcontextprotocol/tasks extension) through the SDK's
own client: batonq_run answers a client that speaks the extension with a task
that follows the batonq task, over stdio (``batonq mcp`` processes) and
streamable HTTP (a ``batonq serve`` process)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS
from tests.mcp_server.support import (
    CreatedTask,
    Service,
    call,
    make_key,
    mcp_process,
    refused,
    running_service,
    stdio_session,
    task_get,
    task_request,
    task_until,
    tasks_client,
)

Sql = psycopg.Connection[tuple[Any, ...]]


@dataclass
class Where:
    """Where the sessions go: ``batonq mcp`` processes on the database's
    owner (operator actions need it) or one ``batonq serve``; ``key`` picks an
    API key (over stdio, ``--key``), none means full access."""

    kind: str
    admin_dsn: str
    service: Service | None = None

    def client(self, key: str | None = None) -> contextlib.AbstractAsyncContextManager[Client]:
        if self.service is None:
            return tasks_client(mcp_process(self.admin_dsn, *(["--key", key] if key else [])))
        return tasks_client(self.service.url, key or self.service.admin_key)


@pytest.fixture(params=["stdio", "http"])
def where(request: pytest.FixtureRequest, admin_dsn: str, tmp_path: Path) -> Iterator[Where]:
    if request.param == "stdio":
        yield Where("stdio", admin_dsn)
        return
    with running_service(admin_dsn, tmp_path / "serve.log") as service:
        yield Where("http", admin_dsn, service)


async def run_as_task(client: Client, **arguments: Any) -> CreatedTask:
    created = await client.session.call_tool("batonq_run", arguments, allow_claimed=True)
    assert isinstance(created, CreatedTask), created
    return created


@contextlib.asynccontextmanager
async def worker(where: Where, queue: str, finish: str, **arguments: Any) -> AsyncIterator[None]:
    """Another agent: claims one task of ``queue`` (waiting for it) and ends
    it with ``finish`` (batonq_complete or batonq_fail) and ``arguments``."""

    async def work() -> None:
        async with where.client() as agent:
            claimed = await agent.call_tool("batonq_claim", {"queue": queue, "wait_seconds": 30})
            task = (claimed.structured_content or {})["task"]
            assert task is not None, "the worker found no task"
            ended = await agent.call_tool(finish, {"lease_token": task["lease_token"], **arguments})
            assert not ended.is_error, ended

    async with anyio.create_task_group() as group:
        group.start_soon(work)
        yield


async def test_a_run_is_a_task_that_completes_with_the_workers_result(where: Where) -> None:
    async with where.client() as coordinator, where.client() as other:
        assert coordinator.session.protocol_version == "2026-07-28"
        created = await run_as_task(
            coordinator, queue="shards", payload={"shard": 7}, idempotency_key="shard-07"
        )
        assert created.status == "working" and created.task_id.startswith("t_")
        # Committed before the answer: another session finds it at once.
        seen = await task_get(other.session, created.task_id)
        assert (seen.status, seen.created_at) == ("working", created.created_at)
        assert seen.status_message == "pending: waiting for a worker to claim it"

        async with worker(where, "shards", "batonq_complete", result={"passed": 212}):
            done = await task_until(other.session, created.task_id, "completed")
        assert done.result is not None and done.result["isError"] is False
        answer = done.result["structuredContent"]
        assert (answer["task_id"], answer["state"], answer["result"]) == (
            created.task_id,
            "done",
            {"passed": 212},
        )
        assert done.status_message == "done after 1 attempt"

        # The same idempotency key follows the same task, now finished.
        again = await run_as_task(coordinator, queue="shards", payload={}, idempotency_key="shard-07")
        assert (again.task_id, again.status) == (created.task_id, "completed")


async def test_the_sdk_client_follows_a_run_to_its_result(where: Where) -> None:
    """Client.call_tool with the extension: the SDK polls tasks/get and
    returns the tool's answer once a worker completed the task."""
    async with where.client() as coordinator, worker(where, "fleet", "batonq_complete", result={"ok": 1}):
        answer = await coordinator.call_tool("batonq_run", {"queue": "fleet", "payload": {"n": 1}})
    assert not answer.is_error
    assert answer.structured_content is not None
    assert (answer.structured_content["state"], answer.structured_content["result"]) == ("done", {"ok": 1})


async def test_a_dead_task_is_a_failed_task_with_its_last_error(where: Where) -> None:
    async with where.client() as coordinator:
        created = await run_as_task(coordinator, queue="doomed", payload={"n": 1})
        error = "ImportError: no module named 'numpy'"
        async with worker(where, "doomed", "batonq_fail", error=error, requeue=False):
            failed = await task_until(coordinator.session, created.task_id, "failed")
    assert failed.error is not None and failed.error["message"] == error
    assert failed.error["data"]["task_id"] == created.task_id and failed.error["data"]["state"] == "dead"
    assert failed.status_message == "dead after 1 attempt"


async def test_a_task_to_be_retried_is_still_working(where: Where) -> None:
    async with where.client() as coordinator:
        created = await run_as_task(coordinator, queue="flaky", payload={"n": 1})
        async with worker(where, "flaky", "batonq_fail", error="port in use", retry_delay_seconds=600):
            pass
        seen = await task_get(coordinator.session, created.task_id)
    assert (seen.status, seen.status_message) == ("working", "pending: to be retried after 1 attempt")


async def test_cancel_cancels_the_batonq_task_cooperatively(where: Where, sql: Sql) -> None:
    async with where.client() as coordinator, where.client() as agent:
        waiting = await run_as_task(coordinator, queue="cancel", payload={"n": 1}, delay_seconds=3600)
        acknowledged = await task_request(coordinator.session, "tasks/cancel", waiting.task_id)
        assert acknowledged["resultType"] == "complete" and set(acknowledged) <= {"resultType", "_meta"}
        cancelled = await task_until(coordinator.session, waiting.task_id, "cancelled")
        assert cancelled.status_message == "cancelled"

        # A task a worker holds: the worker learns at its next submit.
        held = await run_as_task(coordinator, queue="cancel", payload={"n": 2})
        claimed = (await call(agent.session, "batonq_claim", queue="cancel"))["task"]
        assert claimed["task_id"] == held.task_id
        await task_request(coordinator.session, "tasks/cancel", held.task_id)
        await task_until(coordinator.session, held.task_id, "cancelled")
        message = await refused(agent.session, "batonq_complete", lease_token=claimed["lease_token"])
        assert f"lease no longer held: task {held.task_id} was cancelled by an operator" in message
    states = sql.execute("SELECT state FROM batonq.archive WHERE queue = 'cancel' ORDER BY id").fetchall()
    assert states == [("cancelled",), ("cancelled",)]


async def test_a_key_without_the_queue_in_scope_finds_no_task(where: Where, admin_dsn: str) -> None:
    scoped = make_key(admin_dsn, 2, "other*")
    worker_key = make_key(admin_dsn, 2, "shards")
    async with where.client(worker_key) as owner, where.client(scoped) as stranger:
        created = await run_as_task(owner, queue="shards", payload={"n": 1})
        assert (await task_get(owner.session, created.task_id)).status == "working"
        for method in ("tasks/get", "tasks/update", "tasks/cancel"):
            with pytest.raises(MCPError) as hidden:
                await task_request(stranger.session, method, created.task_id)
            with pytest.raises(MCPError) as absent:
                await task_request(stranger.session, method, "t_999999999")
            assert hidden.value.error.code == absent.value.error.code == INVALID_PARAMS
            assert hidden.value.error.message == f"Failed to retrieve task: task {created.task_id} not found"
            assert absent.value.error.message == "Failed to retrieve task: task t_999999999 not found"
        # A worker key (ring 2) may follow its task but not cancel it.
        with pytest.raises(MCPError) as forbidden:
            await task_request(owner.session, "tasks/cancel", created.task_id)
        assert (
            "forbidden: cancelling a task needs a key of ring 1 (operator)" in forbidden.value.error.message
        )
        assert (await task_get(owner.session, created.task_id)).status == "working"


async def test_a_client_without_the_extension_gets_the_plain_answer(dsn: str, admin_dsn: str) -> None:
    """The legacy handshake (no extension declared): batonq_run answers with
    the task, after waiting for it as long as asked; tasks/get is refused."""
    async with stdio_session(dsn) as session, stdio_session(dsn) as agent:
        plain = await call(session, "batonq_run", queue="plain", payload={"n": 1}, idempotency_key="p-1")
        assert (plain["state"], plain["result"]) == ("pending", None)

        async def complete() -> None:
            task = (await call(agent, "batonq_claim", queue="plain", wait_seconds=30))["task"]
            await call(agent, "batonq_complete", lease_token=task["lease_token"], result={"ok": True})

        async with anyio.create_task_group() as group:
            group.start_soon(complete)
            waited = await call(
                session, "batonq_run", queue="plain", payload={"n": 1}, idempotency_key="p-1", wait_seconds=30
            )
        assert (waited["task_id"], waited["state"], waited["result"]) == (
            plain["task_id"],
            "done",
            {"ok": True},
        )
        with pytest.raises(MCPError) as missing:
            await task_get(session, plain["task_id"])
        assert "io.modelcontextprotocol/tasks" in missing.value.error.message


async def test_cancel_through_a_database_role_that_may_not_says_so(dsn: str) -> None:
    """``batonq mcp`` on the worker role: operator actions are the schema owner's."""
    async with tasks_client(mcp_process(dsn)) as client:
        created = await run_as_task(client, queue="cancel", payload={"n": 1})
        with pytest.raises(MCPError) as refused_cancel:
            await task_request(client.session, "tasks/cancel", created.task_id)
        assert refused_cancel.value.error.message.startswith(
            "forbidden: this server's database role may not cancel tasks"
        )
        assert (await task_get(client.session, created.task_id)).status == "working"
