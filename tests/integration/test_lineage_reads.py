"""A task's answer and its dashboard page show the first 200 tasks of its
run, and read no more: the memory one request takes does not grow with the
run (measured in the service's process with tracemalloc)."""

from __future__ import annotations

import contextlib
import re
import tracemalloc
from collections.abc import AsyncIterator

import httpx

import batonq
from batonq.server import create_server
from batonq.service.reads import LINEAGE_LIMIT

PAD = "x" * 4096
"""Each task's payload: 4 KB."""


def _run(admin: batonq.Client, queue: str, tasks: int) -> str:
    """A run of ``tasks`` tasks (a root and its children); its root's ref."""
    root = admin.enqueue(queue, {"pad": PAD}).task_id
    for start in range(1, tasks, 500):
        admin.enqueue_many(queue, [{"pad": PAD, "n": n} for n in range(start, min(tasks, start + 500))],
                           parent=root)  # fmt: skip
    return f"t_{root}"


@contextlib.asynccontextmanager
async def _service(admin_dsn: str, admin: batonq.Client) -> AsyncIterator[httpx.AsyncClient]:
    """The service in this process, signed in to the dashboard too (opened
    and closed in one task, as its lifespan needs)."""
    key = admin.create_key(0, ["*"], "lineage").key
    app = create_server(admin_dsn, sweeper=False)
    transport = httpx.ASGITransport(app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=transport, base_url="http://batonq.test", headers={"Authorization": f"Bearer {key}"}
    ) as client:
        token = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/ui/login")).text)
        assert token
        assert (await client.post("/ui/login", data={"key": key, "csrf": token[1]})).status_code == 303
        yield client


async def _peak(http: httpx.AsyncClient, path: str) -> tuple[int, httpx.Response]:
    """The most memory the request for ``path`` took, and its answer."""
    await http.get(path)  # warm: pools, caches, templates
    tracemalloc.start()
    try:
        answer = await http.get(path)
        return tracemalloc.get_traced_memory()[1], answer
    finally:
        tracemalloc.stop()


async def test_a_long_runs_task_is_answered_with_what_is_shown_only(
    admin_dsn: str, admin: batonq.Client
) -> None:
    shown_whole = _run(admin, "lineage:short", LINEAGE_LIMIT)
    long = _run(admin, "lineage:long", 3000)
    async with _service(admin_dsn, admin) as http:
        await _check(http, shown_whole, long)


async def _check(http: httpx.AsyncClient, shown_whole: str, long: str) -> None:
    for path in ("/v1/tasks/{}", "/ui/tasks/{}"):
        baseline, short_answer = await _peak(http, path.format(shown_whole))
        peak, answer = await _peak(http, path.format(long))
        assert short_answer.status_code == answer.status_code == 200
        # Both show 200 tasks; reading the long run's 3,000 would take ~15 times as much.
        measured = f"{path}: {peak / 1e6:.1f} MB for a long run, {baseline / 1e6:.1f} MB for 200"
        assert peak < 1.5 * baseline, measured
    body = (await http.get(f"/v1/tasks/{long}")).json()
    assert len(body["lineage"]) == LINEAGE_LIMIT and body["lineage"][0]["task_id"] == long
    ids = [int(t["task_id"][2:]) for t in body["lineage"]]
    assert ids == sorted(ids)  # oldest first: the run's first 200
    assert body["run"]["tasks"] == 3000  # the answer says the run is longer than its lineage
    page = (await http.get(f"/ui/tasks/{long}")).text
    assert "its first 200 tasks are drawn" in page
