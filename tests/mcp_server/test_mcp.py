"""The MCP server through the SDK's own client, over stdio (``batonq mcp``
processes) and streamable HTTP (a ``batonq serve`` process), on real PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import psycopg
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextResourceContents
from tests.conftest import age
from tests.mcp_server.support import (
    BATONQ,
    READ_TOOLS,
    WRITE_TOOLS,
    Service,
    Target,
    call,
    counts_in_database,
    http_session,
    make_key,
    refused,
    running_service,
    stdio_session,
)

import batonq

Sql = psycopg.Connection[tuple[Any, ...]]


async def test_tools_guide_and_prompt(target: Target) -> None:
    async with target.session() as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == WRITE_TOOLS | READ_TOOLS
        for name, tool in tools.items():
            assert tool.description is not None and len(tool.description) > 100, name
            assert tool.output_schema is not None, name
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is (name in READ_TOOLS), name
        claim = tools["batonq_claim"].input_schema["properties"]
        assert claim["wait_seconds"]["maximum"] == 55
        assert claim["lease_seconds"]["anyOf"][0]["maximum"] == 3600
        assert tools["batonq_fail"].annotations.destructive_hint is True  # type: ignore[union-attr]
        assert tools["batonq_complete"].annotations.idempotent_hint is True  # type: ignore[union-attr]
        assert tools["batonq_claim"].annotations.idempotent_hint is False  # type: ignore[union-attr]

        [resource] = (await session.list_resources()).resources
        assert str(resource.uri) == "batonq://guide"
        [guide] = (await session.read_resource("batonq://guide")).contents
        assert isinstance(guide, TextResourceContents)
        assert "lease no longer held" in guide.text and "batonq_heartbeat" in guide.text

        prompt = await session.get_prompt("work_through_queue", {"queue": "shards"})
        [message] = prompt.messages
        steps = message.content.text  # type: ignore[union-attr]
        assert 'batonq_claim with queue="shards"' in steps and "batonq_complete" in steps


async def test_three_sessions_complete_40_shards_exactly_once(target: Target, sql: Sql) -> None:
    claimed: list[list[str]] = [[], [], []]

    async def work(session: ClientSession, me: int) -> None:
        while True:
            task = (await call(session, "batonq_claim", queue="shards"))["task"]
            if task is None:
                return
            claimed[me].append(task["task_id"])
            result = {"shard": task["row"]["shard"], "session": me}
            done = await call(session, "batonq_complete", lease_token=task["lease_token"], result=result)
            assert done["state"] == "done" and done["replayed"] is False

    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(target.session()) for _ in range(3)]
        coordinator = sessions[0]
        for n in range(40):
            made = await call(
                coordinator,
                "batonq_enqueue",
                queue="shards",
                payload={"shard": n},
                idempotency_key=f"shard-{n:02}",
            )
            assert made["created"] and made["state"] == "pending"
        again = await call(
            coordinator, "batonq_enqueue", queue="shards", payload={}, idempotency_key="shard-07"
        )
        assert again["created"] is False
        async with anyio.create_task_group() as group:
            for me, session in enumerate(sessions):
                group.start_soon(work, session, me)

    every = [task_id for ids in claimed for task_id in ids]
    assert len(every) == len(set(every)) == 40
    assert all(claimed), f"a session got no task: {[len(ids) for ids in claimed]}"
    assert sql.execute(
        """SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE attempts = 1),
                  count(*) FILTER (WHERE result->'shard' = payload->'shard')
             FROM batonq.archive WHERE queue = 'shards' AND state = 'done'"""
    ).fetchone() == (40, 40, 40, 40)
    assert sql.execute("SELECT count(*) FROM batonq.tasks WHERE queue = 'shards'").fetchone() == (0,)
    # Nothing refused or replayed: the ledger holds no row for the queue.
    assert sql.execute("SELECT count(*) FROM batonq.submits WHERE queue = 'shards'").fetchone() == (0,)
    for me, ids in enumerate(claimed):
        by_me = sql.execute(
            "SELECT 't_' || id FROM batonq.archive WHERE queue = 'shards' AND (result->>'session')::int = %s",
            (me,),
        ).fetchall()
        assert sorted(row[0] for row in by_me) == sorted(ids)


async def test_a_late_complete_after_the_task_was_claimed_again_is_refused(target: Target, sql: Sql) -> None:
    async with target.session() as slow, target.session() as fast:
        await call(slow, "batonq_enqueue", queue="late", payload={"n": 1})
        first = (await call(slow, "batonq_claim", queue="late", lease_seconds=30))["task"]
        age(sql, 60)  # the slow session's lease ran out
        second = (await call(fast, "batonq_claim", queue="late"))["task"]
        assert second["task_id"] == first["task_id"]
        assert second["fencing_token"] > first["fencing_token"] and second["attempt"] == 2

        message = await refused(
            slow, "batonq_complete", lease_token=first["lease_token"], result={"by": "slow"}
        )
        assert (
            f"lease no longer held: task {first['task_id']} was claimed again by another worker"
            f" (fencing token {second['fencing_token']}, yours is {first['fencing_token']});"
            " drop your result" in message
        )
        assert "lease no longer held" in await refused(
            slow, "batonq_heartbeat", lease_token=first["lease_token"]
        )

        await call(fast, "batonq_complete", lease_token=second["lease_token"], result={"by": "fast"})
        late = await refused(slow, "batonq_fail", lease_token=first["lease_token"], error="too slow")
        assert f"lease no longer held: task {first['task_id']} is already done" in late

    task_id = int(first["task_id"][2:])
    assert sql.execute("SELECT state, result FROM batonq.archive WHERE id = %s", (task_id,)).fetchone() == (
        "done",
        {"by": "fast"},
    )
    set_aside = sql.execute(
        "SELECT kind FROM batonq.submits WHERE task_id = %s AND fencing_token = %s AND outcome = 'set_aside'"
        " ORDER BY at",
        (task_id, first["fencing_token"]),
    ).fetchall()
    assert [kind for (kind,) in set_aside] == ["complete", "heartbeat", "fail"]


async def test_tasks_reports_counts_that_match_the_database(target: Target, sql: Sql) -> None:
    q = "mixed"
    async with target.session() as session:
        for n in range(8):
            await call(session, "batonq_enqueue", queue=q, payload={"n": n}, priority=8 - n)
        await call(session, "batonq_enqueue", queue=q, payload={"later": True}, delay_seconds=3600)
        leases = [(await call(session, "batonq_claim", queue=q))["task"] for _ in range(6)]
        for lease in leases[:2]:
            await call(
                session, "batonq_complete", lease_token=lease["lease_token"], result={"ok": lease["row"]}
            )
        await call(
            session, "batonq_fail", lease_token=leases[2]["lease_token"], error="no such file", requeue=False
        )
        await call(
            session,
            "batonq_fail",
            lease_token=leases[3]["lease_token"],
            error="flaky",
            retry_delay_seconds=600,
        )
        # leases[4:] stay leased; 2 tasks stay claimable.

        report = await call(session, "batonq_tasks", queue=q)
        reported = {state: report["counts"][state] for state in counts_in_database(sql, q)}
        assert reported == counts_in_database(sql, q)
        expected = {"pending": 2, "scheduled": 2, "leased": 2, "done": 2, "dead": 1}
        assert reported == {"waiting": 0, "held": 0, "cancelled": 0, **expected}
        assert len(report["tasks"]) == 9
        assert {t["state"] for t in report["tasks"]} == {"pending", "leased", "done", "dead"}

        [dead] = (await call(session, "batonq_tasks", queue=q, status="dead"))["tasks"]
        assert dead["task_id"] == leases[2]["task_id"]
        assert (dead["attempts"], dead["last_error"]) == (1, "no such file")
        done = (await call(session, "batonq_tasks", queue=q, status="done"))["tasks"]
        assert sorted(t["task_id"] for t in done) == sorted(lease["task_id"] for lease in leases[:2])
        assert all(t["result"] == {"ok": t["payload"]} for t in done)
        [retrying] = [
            t for t in (await call(session, "batonq_tasks", queue=q, status="pending"))["tasks"]
            if t["task_id"] == leases[3]["task_id"]
        ]  # fmt: skip
        assert (retrying["attempts"], retrying["last_error"]) == (1, "flaky")

        [stats] = [s for s in (await call(session, "batonq_queues"))["queues"] if s["queue"] == q]
        assert {state: stats[state] for state in reported} == reported


async def test_a_long_poll_claim_returns_the_task_enqueued_a_second_later(
    target: Target, admin_dsn: str
) -> None:
    def enqueue() -> None:
        with batonq.connect(admin_dsn) as client:
            client.enqueue("poll", {"late": True})

    async with target.session() as session:
        assert (await call(session, "batonq_claim", queue="poll"))["task"] is None
        # The scenario itself: the task arrives while the claim waits.
        later = threading.Timer(1.0, enqueue)
        started = time.monotonic()
        later.start()
        try:
            got = await call(session, "batonq_claim", queue="poll", wait_seconds=10)
        finally:
            later.join()
        waited = time.monotonic() - started
    assert got["task"] is not None and got["task"]["row"] == {"late": True}
    assert 0.9 <= waited < 6, waited


async def test_read_only_sees_and_may_use_no_write_tools(target: Target) -> None:
    async with target.session(read_only=True) as session:
        assert {tool.name for tool in (await session.list_tools()).tools} == READ_TOOLS
        message = await refused(session, "batonq_enqueue", queue="shards", payload={"n": 1})
        assert "forbidden: batonq_enqueue writes, and this connection is read-only" in message
        assert "forbidden" in await refused(session, "batonq_claim", queue="shards")
        assert (await call(session, "batonq_tasks", queue="shards"))["tasks"] == []
        await call(session, "batonq_queues")


async def test_http_needs_a_valid_key(service: Service) -> None:
    for headers in ({}, {"Authorization": "Bearer bq_1_" + "0" * 64}, {"Authorization": "Basic x"}):
        answer = httpx.post(service.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=headers)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == "Bearer"
        assert answer.json()["error"]["code"] == "unauthorized"
    card = httpx.get(f"{service.base}/.well-known/mcp.json").json()
    assert card["remotes"] == [
        {
            "type": "streamable-http",
            "url": service.url,
            "headers": [
                {
                    "name": "Authorization",
                    "description": "Bearer <batonq API key>; a ring 3 key sees only the reading tools",
                    "isRequired": True,
                    "isSecret": True,
                }
            ],
        }
    ]


async def test_http_enforces_queue_scopes_per_call(service: Service, admin_dsn: str) -> None:
    scoped = make_key(admin_dsn, 2, "shards*")
    async with http_session(service.url, service.admin_key) as admin:
        await call(admin, "batonq_enqueue", queue="other", payload={})
    async with http_session(service.url, scoped) as session:
        await call(session, "batonq_enqueue", queue="shards-a", payload={"n": 1})
        task = (await call(session, "batonq_claim", queue="shards-a"))["task"]
        assert "forbidden: this key may not use queue 'other'" in await refused(
            session, "batonq_claim", queue="other"
        )
        assert "forbidden" in await refused(session, "batonq_tasks", queue="other")
        queues = (await call(session, "batonq_queues"))["queues"]
        assert [q["queue"] for q in queues] == ["shards-a"]
        await call(session, "batonq_complete", lease_token=task["lease_token"], result=None)


async def test_queues_come_a_page_at_a_time(target: Target) -> None:
    async with target.session() as session:
        for name in ("page:c", "page:a", "page:b"):
            await call(session, "batonq_enqueue", queue=name, payload=1)
        first = await call(session, "batonq_queues", limit=2)
        assert [q["queue"] for q in first["queues"]] == ["page:a", "page:b"]
        assert first["next_cursor"] == "page:b"
        rest = await call(session, "batonq_queues", cursor=first["next_cursor"], limit=2)
        assert [q["queue"] for q in rest["queues"]] == ["page:c"] and rest["next_cursor"] is None
        assert "limit" in await refused(session, "batonq_queues", limit=1001)


async def test_a_worker_key_creates_a_bounded_number_of_queues_over_http_too(
    admin_dsn: str, tmp_path: Path
) -> None:
    with running_service(admin_dsn, tmp_path / "serve.log", "--new-queues-per-key", "2") as service:
        worker = make_key(admin_dsn, 2)
        async with http_session(service.url, worker) as session:
            for name in ("made:1", "made:2", "made:1"):
                await call(session, "batonq_enqueue", queue=name, payload=1)
            answer = await refused(session, "batonq_enqueue", queue="made:3", payload=1)
            made = "too_many_new_queues: this key may create 2 queues an hour, and has made 2"
            assert made in answer, answer
            assert re.search(r"\(retry in [0-9]+ s\)$", answer), answer
            await call(session, "batonq_enqueue", queue="made:2", payload=2)  # existing queues take tasks
        async with http_session(service.url, service.admin_key) as admin:
            await call(admin, "batonq_enqueue", queue="made:by-admin", payload=1)  # rings 0 and 1: no limit
            queues = (await call(admin, "batonq_queues"))["queues"]
    assert sorted(q["queue"] for q in queues) == ["made:1", "made:2", "made:by-admin"]


async def test_what_cannot_be_served_and_foreign_parents_are_refused_with_a_reason(
    service: Service, admin_dsn: str
) -> None:
    scoped = make_key(admin_dsn, 2, "shards*")
    async with http_session(service.url, service.admin_key) as admin:
        foreign = (await call(admin, "batonq_enqueue", queue="secret", payload={}))["task_id"]
    async with http_session(service.url, scoped) as session:
        deep: Any = 1
        for _ in range(100):
            deep = [deep]
        assert (await refused(session, "batonq_enqueue", queue="shards-deep", payload=deep)).endswith(
            ": json_too_deep: payload nests 100 levels deep; the limit is 64"
        )
        await call(session, "batonq_enqueue", queue="shards-deep", payload=1)
        task = (await call(session, "batonq_claim", queue="shards-deep"))["task"]
        answer = await refused(session, "batonq_complete", lease_token=task["lease_token"], result=deep)
        assert answer.endswith(": json_too_deep: result nests 100 levels deep; the limit is 64")
        # A parent the key cannot see reads as one nobody has.
        answers = [
            await refused(session, "batonq_enqueue", queue="shards-deep", payload=2, parent=parent)
            for parent in (foreign, "t_999999996")
        ]
        assert answers[0].endswith(f": task_not_found: task {foreign} not found")
        assert answers[1] == answers[0].replace(foreign, "t_999999996")
        tasks = (await call(session, "batonq_tasks", queue="shards-deep"))["tasks"]
        assert [t["state"] for t in tasks] == ["leased"], "the lease stands and nothing was enqueued"


async def test_http_serves_the_2026_protocol_too(service: Service, admin_dsn: str) -> None:
    """The SDK's high-level Client discovers the newest protocol (no session,
    no handshake); keys and read-only filtering hold there as well."""
    for key, expected in (
        (make_key(admin_dsn, 3), READ_TOOLS),
        (make_key(admin_dsn, 2), READ_TOOLS | WRITE_TOOLS),
    ):
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http,
            Client(streamable_http_client(service.url, http_client=http)) as client,
        ):
            assert client.session.protocol_version == "2026-07-28"
            assert {tool.name for tool in (await client.list_tools()).tools} == expected
            result = await client.call_tool("batonq_tasks", {"queue": "shards"})
            assert not result.is_error and result.structured_content is not None


async def test_stdio_with_a_key_takes_its_ring_and_queues(admin_dsn: str) -> None:
    observer = make_key(admin_dsn, 3)
    async with stdio_session(admin_dsn, "--key", observer) as session:
        assert {tool.name for tool in (await session.list_tools()).tools} == READ_TOOLS
    scoped = make_key(admin_dsn, 2, "shards")
    async with stdio_session(admin_dsn, "--key", scoped) as session:
        await call(session, "batonq_enqueue", queue="shards", payload={})
        assert "forbidden" in await refused(session, "batonq_enqueue", queue="other", payload={})
    refusal = subprocess.run(
        [BATONQ, "--dsn", admin_dsn, "mcp", "--key", "bq_1_" + "0" * 64],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refusal.returncode == 1
    assert refusal.stdout == ""
    assert refusal.stderr == "error: unauthorized: invalid or revoked API key\n"


async def test_a_nul_character_is_refused_naming_the_field(target: Target) -> None:
    async with target.session() as session:
        for field, arguments in (
            ("payload", {"payload": {"note": "a\u0000b"}}),
            ("payload", {"payload": {"key\u0000": 1}}),
            ("idempotency_key", {"payload": 1, "idempotency_key": "k\u0000"}),
        ):
            message = await refused(session, "batonq_enqueue", queue="nul", **arguments)
            assert f"invalid_argument: {field} contains a NUL character" in message, message
        await call(session, "batonq_enqueue", queue="nul", payload=1)
        claimed = await call(session, "batonq_claim", queue="nul")
        token = claimed["task"]["lease_token"]
        message = await refused(session, "batonq_heartbeat", lease_token=token, stage="step\u00001")
        assert "invalid_argument: stage contains a NUL character" in message, message
        message = await refused(session, "batonq_complete", lease_token=token, result=["\u0000"])
        assert "invalid_argument: result contains a NUL character" in message, message
        message = await refused(session, "batonq_fail", lease_token=token, error="\u0000")
        assert "invalid_argument: error contains a NUL character" in message, message
        # Nothing was written: the task is still leased, and completes as usual.
        assert (await call(session, "batonq_complete", lease_token=token, result="ok"))["state"] == "done"


def test_stdio_answers_a_line_that_is_not_json_rpc_and_serves_on(dsn: str) -> None:
    process = subprocess.Popen(
        [BATONQ, "--dsn", dsn, "mcp"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True)
    reader.start()

    def replies(count: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 30
        while len(lines) < count and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert len(lines) >= count, (lines, process.poll())
        return [json.loads(line) for line in lines[:count]]

    try:
        client = {"name": "t", "version": "1"}
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
        unreadable = ("this is not json", '{"jsonrpc": "2.0", "hello": 1}', "\u0000\ufffd{")
        for line in (*unreadable, json.dumps(initialize)):
            process.stdin.write(line + "\n")
            process.stdin.flush()
        garbage, no_message, binary, answer = replies(4)
        assert garbage["jsonrpc"] == "2.0" and garbage["id"] is None and garbage["error"]["code"] == -32700
        assert no_message["error"]["code"] == -32600 and no_message["id"] is None
        assert binary["error"]["code"] == -32700
        assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "batonq"
    finally:
        process.stdin.close()
        process.wait(timeout=30)
        reader.join(timeout=10)
        process.stdout.close()
