"""Every per-request and per-key cost is bounded: list bodies, queues named
by one enqueue, streams and long-polls open per key, and the counting that
announce streams and /metrics do, which does not grow with their number."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict
from tests.e2e.conftest import KEEPALIVE_S, Serve
from tests.e2e.live import LiveServer, Subscriber, claim_one, enqueue, new_key, problem
from tests.mcp_server.support import call, http_session, refused, text
from tests.waiting import wait_for

SUBSCRIBERS = 40
WAKE_UPS = 5


def _counting_queue_stats(admin_dsn: str) -> Callable[[], int]:
    """Track function calls in the test's database (servers started from
    now on); returns how to read how often the queues were counted."""
    dbname = conninfo_to_dict(admin_dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{dbname}\" SET track_functions = 'all'")

    def calls() -> int:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
                " WHERE schemaname = 'batonq' AND funcname = 'queue_stats'"
            ).fetchone()
        assert row is not None
        return int(row[0])

    return calls


def test_announce_streams_share_one_count_per_wake_up(admin_dsn: str, serve: Serve) -> None:
    calls = _counting_queue_stats(admin_dsn)
    server = serve()
    assert server.admin_key
    queue = "limits:shared"
    subscribers = [
        Subscriber(server, server.admin_key, f"/v1/stream?queue={queue}") for _ in range(SUBSCRIBERS)
    ]
    opened = time.monotonic()
    try:
        for subscriber in subscribers:
            subscriber.next(":", timeout=20, data="ready")
        with server.http(server.admin_key) as http:
            for round_ in range(WAKE_UPS):
                enqueue(http, queue, round_)
                for subscriber in subscribers:  # every subscriber still hears of every enqueue
                    subscriber.next("available", timeout=10)
                claim_one(http, queue)
    finally:
        for subscriber in subscribers:
            subscriber.close()
    idle_looks = 2 * (time.monotonic() - opened) / KEEPALIVE_S
    server.stop()  # its connections end, and report their statistics as they do
    counted = calls()
    # One count per subscriber as it opens (they may share some), about one
    # per wake-up, and one per keep-alive interval while idle; counting per
    # subscriber would be SUBSCRIBERS per wake-up and per interval.
    assert counted <= SUBSCRIBERS + 3 * WAKE_UPS + idle_looks, (counted, idle_looks)


def test_metrics_scrapers_share_one_render(admin_dsn: str, serve: Serve) -> None:
    calls = _counting_queue_stats(admin_dsn)
    server = serve()
    with server.http() as anonymous:
        for _ in range(30):
            assert anonymous.get("/metrics").status_code == 200
    server.stop()
    assert calls() <= 2  # rendered at most every 5 s


def test_lists_and_queues_per_request_are_bounded(shared_http: httpx.Client) -> None:
    many = [{"queue": "limits:list", "payload": i} for i in range(1001)]
    error = problem(shared_http.post("/v1/enqueue", json=many), 413, "too_many_items")
    assert error["message"] == "a list of 1001 items: send at most 1000 per request"
    assert shared_http.post("/v1/enqueue", json=many[:1000]).status_code == 200
    submits = [{"lease_token": "limits:list/1/1/x", "result": 1}] * 1001
    problem(shared_http.post("/v1/submit", json=submits), 413, "too_many_items")
    # A claim of over 1,000 tasks is refused like a list of them, before any is leased.
    too_many = {"queue": "limits:list", "max_tasks": 1001}
    error = problem(shared_http.post("/v1/claim", json=too_many), 413, "too_many_items")
    assert error["message"] == "max_tasks 1001: claim at most 1000 tasks per request"
    assert len(shared_http.post("/v1/claim", json={**too_many, "max_tasks": 1000}).json()["tasks"]) == 1000
    schema = shared_http.get("/openapi.json").json()["components"]["schemas"]["ClaimIn"]
    assert schema["properties"]["max_tasks"]["anyOf"][0]["maximum"] == 1000

    spread = [{"queue": f"limits:spread-{i}", "payload": i} for i in range(101)]
    error = problem(shared_http.post("/v1/enqueue", json=spread), 413, "too_many_queues")
    assert error["message"] == "a list that names 101 queues: send at most 100 per request"
    names = {q["queue"] for q in shared_http.get("/v1/queues").json()["queues"]}
    assert not any(name.startswith("limits:spread-") for name in names), "nothing was created"
    assert shared_http.post("/v1/enqueue", json=spread[:100]).status_code == 200


def test_a_key_holds_a_bounded_number_of_streams_and_long_polls(serve: Serve) -> None:
    server: LiveServer = serve("--max-streams-per-key", "3")
    assert server.admin_key
    with server.http(server.admin_key) as admin:
        _, key = new_key(admin, 2)
        # Tasks for the probe below, so that a probe let through holds its slot only while it claims one.
        probe_tasks = [{"queue": "limits:probe", "payload": i} for i in range(1000)]
        assert admin.post("/v1/enqueue", json=probe_tasks).status_code == 200
    streams = [Subscriber(server, key, "/v1/stream?queue=limits:cap") for _ in range(2)]
    polls: list[httpx.Response] = []

    def long_poll() -> threading.Thread:
        thread = threading.Thread(
            target=lambda: polls.append(
                httpx.post(f"{server.url}/v1/claim", json={"queue": "limits:cap", "wait_s": 55},
                           headers={"Authorization": f"Bearer {key}"}, timeout=90)
            )
        )  # fmt: skip
        thread.start()
        return thread

    try:
        for stream in streams:
            stream.next(":", timeout=20, data="ready")
        polling = long_poll()
        with server.http(key) as http:
            wait = {"queue": "limits:probe", "wait_s": 1}

            def fourth_refused() -> httpx.Response | None:
                """The long-poll is open once a fourth long-poll is refused. A
                probe let through holds a slot while it claims a task: a
                long-poll arriving then is refused, rightly, and opened again."""
                nonlocal polling
                if not polling.is_alive() and polls and polls[-1].status_code == 429:
                    polling = long_poll()
                answer = http.post("/v1/claim", json=wait)
                return answer if answer.status_code == 429 else None

            refused = wait_for(fourth_refused, timeout=30, what="a fourth long-poll refused")
            error = problem(refused, 429, "too_many_streams")
            assert "3 streams and long-poll claims open" in error["message"]
            assert refused.headers["retry-after"] == "5"
            problem(http.get("/v1/stream?queue=limits:cap"), 429, "too_many_streams")
            # A claim that does not wait is not held open, and other keys have streams of their own.
            assert http.post("/v1/claim", json={"queue": "limits:cap"}).status_code == 200
        other = Subscriber(server, server.admin_key, "/v1/stream?queue=limits:cap")
        other.next(":", timeout=20, data="ready")
        other.close()
        # The long-poll ends with a task; then the key may open a stream again.
        with server.http(server.admin_key) as admin:
            enqueue(admin, "limits:cap", 1)
        polling.join(timeout=60)
        assert polls[-1].status_code == 200 and polls[-1].json()["task_id"] is not None
        again = Subscriber(server, key, "/v1/stream?queue=limits:cap")
        again.next(":", timeout=20, data="ready")
        again.close()
    finally:
        for stream in streams:
            stream.close()


async def test_mcp_waits_are_held_open_under_the_same_per_key_limit(serve: Serve) -> None:
    """One count of a key's long-lived requests, whatever the door: with the
    limit taken by /v1 streams, MCP claims and runs that would wait are
    refused (a run before it enqueues anything); an MCP wait holds a slot
    that a /v1 stream then cannot take."""
    server: LiveServer = serve("--max-streams-per-key", "2")
    assert server.admin_key
    with server.http(server.admin_key) as admin:
        _, key = new_key(admin, 2)
    streams = [Subscriber(server, key, "/v1/stream?queue=limits:mcp") for _ in range(2)]
    try:
        for stream in streams:
            stream.next(":", timeout=20, data="ready")
        async with http_session(f"{server.url}/mcp", key) as session:
            for tool, arguments in (("batonq_claim", {}), ("batonq_run", {"payload": {"n": 1}})):
                message = await refused(session, tool, queue="limits:mcp", wait_seconds=5, **arguments)
                assert "too_many_streams: this key has 2 streams and long-poll claims open" in message
            # A call that does not wait holds nothing.
            assert (await call(session, "batonq_claim", queue="limits:mcp"))["task"] is None
    finally:
        for stream in streams:
            stream.close()
    with server.http(server.admin_key) as admin:
        assert admin.get("/v1/tasks", params={"queue": "limits:mcp"}).json()["tasks"] == []
    async with http_session(f"{server.url}/mcp", key) as session:
        waiting = [asyncio.create_task(session.call_tool("batonq_claim", {"queue": "limits:mcp2",
                                                                          "wait_seconds": 30}))
                   for _ in range(2)]  # fmt: skip
        with server.http(key) as http:

            def stream_refused() -> httpx.Response | None:
                with http.stream("GET", "/v1/stream", params={"queue": "limits:mcp2"}) as response:
                    return response if response.status_code == 429 and response.read() else None

            await asyncio.to_thread(wait_for, stream_refused, timeout=30, what="a stream refused")
        with server.http(server.admin_key) as admin:
            enqueue(admin, "limits:mcp2", 1)
            enqueue(admin, "limits:mcp2", 2)
        for answer in await asyncio.gather(*waiting):
            assert not answer.is_error, text(answer)


def test_a_worker_key_creates_a_bounded_number_of_queues(serve: Serve) -> None:
    server: LiveServer = serve("--new-queues-per-key", "3")
    assert server.admin_key
    with server.http(server.admin_key) as admin:
        _, key = new_key(admin, 2)
        enqueue(admin, "made:by-admin", 0)
        with server.http(key) as http:
            for name in ("made:1", "made:2", "made:1", "made:3", "made:by-admin"):
                enqueue(http, name, 1)
            both = [{"queue": "made:4", "payload": 1}, {"queue": "made:1", "payload": 2}]
            refused = http.post("/v1/enqueue", json=both)
            error = problem(refused, 429, "too_many_new_queues")
            assert error["message"].startswith("this key may create 3 queues an hour, and has made 3")
            assert 0 < int(refused.headers["retry-after"]) <= 3600
            enqueue(http, "made:2", 2)  # existing queues take tasks as before
        enqueue(admin, "made:by-admin-2", 0)  # rings 0 and 1 create queues freely
        names = {q["queue"] for q in admin.get("/v1/queues").json()["queues"]}
    assert {n for n in names if n.startswith("made:")} == {
        "made:1",
        "made:2",
        "made:3",
        "made:by-admin",
        "made:by-admin-2",
    }


def test_queues_come_a_page_at_a_time_within_the_keys_scopes(serve: Serve) -> None:
    server: LiveServer = serve()
    assert server.admin_key
    with server.http(server.admin_key) as admin:
        names = [f"page:a{i}" for i in range(5)] + ["page:b0", "page:b1"]
        assert admin.post("/v1/enqueue", json=[{"queue": n, "payload": 1} for n in names]).status_code == 200
        _, observer = new_key(admin, 3, ["page:a*", "page:b[1]"])

        def pages(http: httpx.Client, limit: int) -> list[list[str]]:
            found, cursor = [], None
            while True:
                params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
                page = http.get("/v1/queues", params=params).json()
                found.append([q["queue"] for q in page["queues"]])
                cursor = page["next_cursor"]
                if cursor is None:
                    return found

        assert pages(admin, 3) == [names[:3], names[3:6], names[6:]]
        assert pages(admin, 1000) == [names]
        with server.http(observer) as scoped:
            assert pages(scoped, 2) == [names[:2], names[2:4], [names[4], "page:b1"], []]
            assert pages(scoped, 1) == [[n] for n in [*names[:5], "page:b1"]] + [[]]
            problem(scoped.get("/v1/queues", params={"limit": 1001}), 422, "invalid_request")


def test_a_claiming_stream_leases_nothing_once_its_subscriber_is_gone(serve: Serve) -> None:
    """A gone subscriber's stream ends at once, its claim in flight with it:
    nothing is leased for a connection that is gone."""
    server: LiveServer = serve("--max-streams-per-key", "1", "--keepalive", "30")
    assert server.admin_key
    with server.http(server.admin_key) as admin:
        _, key = new_key(admin, 2)
    path = "/v1/stream?queue=limits:dropped&claim=true"
    wait = {"queue": "limits:dropped", "wait_s": 0.2}
    with server.http(key) as http:
        with server.http(key) as dropping, dropping.stream("GET", path) as sse:
            lines = sse.iter_lines()  # kept: dropping the iterator closes the response
            assert next(lines) == ": ready"
            problem(http.post("/v1/claim", json=wait), 429, "too_many_streams")
        # The connection is closed; the stream waits in a claim for 30 s.
        wait_for(
            lambda: http.post("/v1/claim", json=wait).status_code == 200,
            timeout=10,
            what="the gone subscriber's slot free",
        )
        enqueue(http, "limits:dropped", {"n": 1})
        assert claim_one(http, "limits:dropped")["attempt"] == 1  # nobody claimed it before
