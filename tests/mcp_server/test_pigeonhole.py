"""Pigeonhole's task queue, as its description words it, on batonq's MCP
tools: its argument names do what it says, and nothing a tool does not take
is silently ignored."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import psycopg
from mcp import ClientSession
from tests.mcp_server.support import READ_TOOLS, WRITE_TOOLS, Target, call, counts_in_database, refused

Sql = psycopg.Connection[tuple[Any, ...]]

FLAKY = {5, 15, 25}
"""Shards whose first run fails and asks to be retried in ten minutes."""
HOPELESS = 38
"""The shard that times out for good."""
MISSING = object()


async def test_the_fan_out_job_in_pigeonholes_words(target: Target, sql: Sql) -> None:
    """ "enqueue 40 test shards and let agents on 3 machines work through
    them", with only the names the description uses."""
    queue = "shop:tasks"
    claimed: list[list[dict[str, Any]]] = [[], [], []]

    async def work(session: ClientSession, me: int) -> None:
        while True:
            task = (await call(session, "batonq_claim", queue=queue, lease_seconds=900, wait_seconds=1))[
                "task"
            ]
            if task is None:
                return
            claimed[me].append(task)
            shard = task["row"]["shard"]
            if shard == HOPELESS:
                await call(
                    session, "batonq_fail", lease_token=task["lease_token"], error="test run timed out",
                    requeue=False,
                )  # fmt: skip
            elif shard in FLAKY:
                await call(
                    session, "batonq_fail", lease_token=task["lease_token"], error="flaky: port in use",
                    retry_delay_seconds=600,
                )  # fmt: skip
            else:
                result = {"passed": 212, "shard": shard}
                await call(session, "batonq_complete", lease_token=task["lease_token"], result=result)

    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(target.session()) for _ in range(3)]
        coordinator = sessions[0]
        for n in range(40):
            await call(
                coordinator,
                "batonq_enqueue",
                queue=queue,
                payload={"shard": n},
                idempotency_key=f"shard-{n:02}",
            )
        again = await call(coordinator, "batonq_enqueue", queue=queue, payload={}, idempotency_key="shard-07")
        assert again["created"] is False
        later = await call(
            coordinator, "batonq_enqueue", queue=queue, payload={"report": 1}, delay_seconds=3600
        )
        async with anyio.create_task_group() as group:
            for me, session in enumerate(sessions):
                group.start_soon(work, session, me)

        every = [task for tasks in claimed for task in tasks]
        assert sorted(task["row"]["shard"] for task in every) == list(range(40))
        assert all(claimed), [len(tasks) for tasks in claimed]
        # lease_seconds: 900 is the lease each claim got (the default is 300).
        assert all(870 < task["lease_expires_in_s"] <= 900 for task in every)

        report = await call(coordinator, "batonq_tasks", queue=queue)
        counts = {
            state: report["counts"][state] for state in ("pending", "scheduled", "leased", "done", "dead")
        }
        assert counts == {"pending": 0, "scheduled": len(FLAKY) + 1, "leased": 0, "done": 36, "dead": 1}
        assert report["counts"]["scheduled"] == counts_in_database(sql, queue)["scheduled"]
        [dead] = (await call(coordinator, "batonq_tasks", queue=queue, status="dead"))["tasks"]
        assert (dead["idempotency_key"], dead["attempts"], dead["last_error"]) == (
            f"shard-{HOPELESS}", 1, "test run timed out",
        )  # fmt: skip

    # delay_seconds and retry_delay_seconds are what the database waits.
    waits = dict(
        sql.execute(
            "SELECT coalesce(idempotency_key, 'later'), round(extract(epoch FROM run_at - now()))"
            " FROM batonq.tasks WHERE queue = %s",
            (queue,),
        ).fetchall()
    )
    assert set(waits) == {"later", *(f"shard-{n:02}" for n in FLAKY)}
    # (less the seconds the test took since)
    assert all(540 < wait <= (3600 if key == "later" else 600) for key, wait in waits.items()), waits
    assert waits["later"] > 3540
    assert later["state"] == "pending"


async def test_the_short_names_are_aliases(target: Target, sql: Sql) -> None:
    async with target.session() as session:
        await call(session, "batonq_enqueue", queue="short", payload={"n": 1}, delay_s=3600)
        assert (await call(session, "batonq_claim", queue="short", wait_s=0))["task"] is None
        await call(session, "batonq_enqueue", queue="short", payload={"n": 2})
        task = (await call(session, "batonq_claim", queue="short", lease_s=900))["task"]
        assert 870 < task["lease_expires_in_s"] <= 900
        await call(session, "batonq_fail", lease_token=task["lease_token"], error="x", retry_delay_s=600)
        [retrying] = (await call(session, "batonq_tasks", queue="short", state="pending"))["tasks"][:1]
        assert retrying["task_id"] == task["task_id"]


ENQUEUE = "queue, payload, idempotency_key, priority, delay_seconds (or delay_s), max_attempts, parent, group"
DEBOUNCE = ", debounce_key, debounce_seconds (or debounce_s), max_wait_seconds (or max_wait_s), keep"
TAKES = {
    "batonq_enqueue": ENQUEUE + DEBOUNCE,
    "batonq_run": ENQUEUE + ", wait_seconds (or wait_s)",
    "batonq_claim": "queue, lease_seconds (or lease_s), wait_seconds (or wait_s)",
    "batonq_heartbeat": "lease_token, stage, lease_seconds (or lease_s)",
    "batonq_complete": "lease_token, result",
    "batonq_fail": "lease_token, error, retry_delay_seconds (or retry_delay_s), requeue",
    "batonq_tasks": "queue, status (or state), limit",
    "batonq_queues": "cursor, limit",
    "batonq_schedule": "action, name, cron, queue, payload, tz, missed",
}


async def test_every_tool_refuses_an_unknown_argument(target: Target, sql: Sql) -> None:
    async with target.session() as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == set(TAKES) == WRITE_TOOLS | READ_TOOLS
        for name, takes in TAKES.items():
            message = await refused(session, name, queue="shop:tasks", payload={}, delay=3600)
            if name == "batonq_queues":
                assert message == f"unknown arguments 'queue', 'payload', 'delay': {name} takes {takes}"
            elif name in ("batonq_enqueue", "batonq_run", "batonq_schedule"):
                assert message == f"unknown argument 'delay': {name} takes {takes}"
            else:
                assert message.startswith("unknown arguments ") and message.endswith(
                    f": {name} takes {takes}"
                )
            # The input schema advertises exactly the names the tool takes.
            schema = tools[name].input_schema
            assert schema["additionalProperties"] is False
            advertised = set(schema.get("properties", {}))
            assert advertised == set(takes.replace(" (or", ",").replace(")", "").split(", ")) - {
                "no arguments"
            }
        claim = tools["batonq_claim"].input_schema["properties"]
        assert claim["lease_s"]["description"] == "Another name for lease_seconds."
        assert claim["lease_s"]["anyOf"] == claim["lease_seconds"]["anyOf"]
    # A refused call changed nothing.
    assert sql.execute("SELECT count(*) FROM batonq.tasks").fetchone() == (0,)


async def test_bad_values_are_answered_with_a_sentence(target: Target) -> None:
    async with target.session() as session:
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("batonq_claim", {"lease_seconds": 7200}, "lease_seconds must be between 1 and 3600 (got 7200)"),
            ("batonq_claim", {"lease_s": 0}, "lease_s must be between 1 and 3600 (got 0)"),
            ("batonq_claim", {"wait_seconds": 60}, "wait_seconds must be between 0 and 55 (got 60)"),
            (
                "batonq_enqueue",
                {"delay_seconds": -1},
                "delay_seconds must be between 0 and 315360000 (got -1)",
            ),
            (
                "batonq_enqueue",
                {"priority": 2**31},
                "priority must be between -2147483648 and 2147483647 (got 2147483648)",
            ),
            ("batonq_enqueue", {"max_attempts": 0}, "max_attempts must be between 1 and 1000 (got 0)"),
            (
                "batonq_enqueue",
                {"queue": "Shop Tasks"},
                "queue must be a queue name: 1-128 characters from a-z 0-9 _ . : -, "
                'starting with a letter or digit (got "Shop Tasks")',
            ),
            ("batonq_enqueue", {"payload": MISSING}, "payload is required"),
            (
                "batonq_enqueue",
                {"idempotency_key": "k" * 513},
                "idempotency_key must be at most 512 characters",
            ),
            ("batonq_enqueue", {"group": ""}, "group must not be empty"),
            (
                "batonq_fail",
                {"retry_delay_seconds": "soon"},
                'retry_delay_seconds must be a number (got "soon")',
            ),
            ("batonq_fail", {"requeue": "never"}, 'requeue must be true or false (got "never")'),
            (
                "batonq_tasks",
                {"status": "failed"},
                "status must be 'waiting', 'held', 'pending', 'scheduled', 'leased', 'done', 'dead'"
                ' or \'cancelled\' (got "failed")',
            ),
            ("batonq_tasks", {"limit": 1.5}, "limit must be a whole number (got 1.5)"),
            (
                "batonq_claim",
                {"lease_seconds": 60, "lease_s": 60},
                "lease_seconds and lease_s are the same argument: give only one of them",
            ),
        ]
        valid = {
            "batonq_claim": {"queue": "q"},
            "batonq_enqueue": {"queue": "q", "payload": 1},
            "batonq_fail": {"lease_token": "q/1/1/x"},
            "batonq_tasks": {"queue": "q"},
        }
        for tool, changes, expected in cases:
            arguments = {k: v for k, v in {**valid[tool], **changes}.items() if v is not MISSING}
            message = await refused(session, tool, **arguments)
            assert message == expected, (tool, arguments, message)
