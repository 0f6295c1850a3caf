"""Pause stops claims at once on the paths that claim in-process: the
client's claim and long-poll, and the worker (HTTP, SSE and MCP: in
tests/e2e/test_http_flow.py and tests/mcp_server/test_mcp_flow.py)."""

from __future__ import annotations

import threading
import time

import batonq


def test_a_long_poll_on_a_paused_queue_waits_until_resumed(
    client: batonq.Client, admin: batonq.Client
) -> None:
    client.enqueue("mail", {"n": 1})
    admin.pause("mail")
    assert client.claim("mail") == []
    got: list[list[batonq.Lease]] = []
    poll = threading.Thread(target=lambda: got.append(client.claim("mail", wait_s=30)))
    started = time.monotonic()
    poll.start()
    time.sleep(1.0)  # the long-poll is under way on the paused queue
    assert got == []
    admin.resume("mail")
    poll.join(timeout=30)
    [[lease]] = got
    assert lease.row == {"n": 1}
    assert time.monotonic() - started < 10  # woken by the resume, not the end of its wait


async def test_a_worker_claims_nothing_from_a_paused_queue(dsn: str, admin: batonq.Client) -> None:
    app = batonq.App()
    ran: list[int] = []

    @app.task("mail")
    def send(job: batonq.Job) -> None:
        ran.append(job.id)

    admin.enqueue("mail", {"n": 1})
    admin.pause("mail")
    assert await batonq.Worker(app, dsn=dsn, handle_signals=False, burst=True).run_async() == 0
    assert ran == []
    admin.resume("mail")
    assert await batonq.Worker(app, dsn=dsn, handle_signals=False, burst=True).run_async() == 0
    assert len(ran) == 1
