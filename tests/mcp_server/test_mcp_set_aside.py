"""batonq_tasks shows the writes a late worker had refused: "a late submit
from an older lease is set aside" can be checked by an agent, without SQL."""

from __future__ import annotations

from typing import Any

import psycopg
from tests.conftest import age
from tests.mcp_server.support import Target, call, refused

Sql = psycopg.Connection[tuple[Any, ...]]


async def test_tasks_lists_the_writes_set_aside(target: Target, sql: Sql) -> None:
    async with target.session() as slow, target.session() as fast:
        await call(slow, "batonq_enqueue", queue="aside", payload={"n": 1})
        first = (await call(slow, "batonq_claim", queue="aside", lease_s=30))["task"]
        age(sql, 60)  # the slow session's lease ran out
        second = (await call(fast, "batonq_claim", queue="aside"))["task"]
        await refused(slow, "batonq_complete", lease_token=first["lease_token"], result={"by": "slow"})
        await call(fast, "batonq_complete", lease_token=second["lease_token"], result={"by": "fast"})
        await refused(slow, "batonq_fail", lease_token=first["lease_token"], error="too slow")

        report = await call(fast, "batonq_tasks", queue="aside")
    assert [t["result"] for t in report["tasks"]] == [{"by": "fast"}]
    assert [(w["task_id"], w["kind"], w["fencing_token"], w["state"]) for w in report["set_aside"]] == [
        (first["task_id"], "complete", first["fencing_token"], "leased"),
        (first["task_id"], "fail", first["fencing_token"], "done"),
    ]
    # Who held the lease those writes named: the slow session's worker.
    worker = sql.execute(
        "SELECT e ->> 'worker' FROM batonq.archive a, jsonb_array_elements(a.errors) e WHERE a.id = %s",
        (int(first["task_id"][2:]),),
    ).fetchone()
    assert worker is not None and worker[0]
    assert {w["worker"] for w in report["set_aside"]} == {worker[0]}
    # And the key that claimed it, over HTTP (a stdio server has none).
    keys = sql.execute("SELECT id FROM batonq.api_keys WHERE ring = 2").fetchall()
    assert {w["key_id"] for w in report["set_aside"]} == ({keys[0][0]} if target.kind == "http" else {None})
