"""GET /v1/stream against a real server: an ``available`` event within
200 ms of an enqueue; keep-alive comments; ``claim=true`` hands each task to
exactly one of 4 subscribers and honours the credit; a dropped subscriber's
leased tasks come back when their lease runs out; a database outage ends
open streams with an ``error`` event."""

from __future__ import annotations

import itertools
import json
import signal
import statistics
import threading
import time
from collections import Counter
from typing import Any

import httpx
import psycopg
from tests.conftest import age
from tests.e2e.conftest import KEEPALIVE_S
from tests.e2e.live import LiveServer, Subscriber, claim_one, enqueue, new_key, problem, sse_events
from tests.private_cluster import private_cluster
from tests.waiting import wait_for

import batonq

ROUNDS = 5
ANNOUNCE_WITHIN_S = 0.2


def test_a_subscriber_hears_of_an_enqueue_within_200_ms(server: LiveServer, http: httpx.Client) -> None:
    queue = "sse:latency"
    subscriber = Subscriber(server, server.admin_key, f"/v1/stream?queue={queue}")
    latencies = []
    last_id = 0
    try:
        subscriber.next(":", timeout=10, data="ready")  # subscribed
        for round_ in range(ROUNDS):
            sent = time.monotonic()
            enqueue(http, queue, {"round": round_})
            event = subscriber.next("available", timeout=5)
            while event.at < sent:  # a reminder about the last round's task, sent before this enqueue
                event = subscriber.next("available", timeout=5)
            latencies.append(event.at - sent)
            assert json.loads(event.data) == {"queue": queue, "pending": 1}
            assert event.id is not None and int(event.id) > last_id, "event ids go up"
            last_id = int(event.id)
            claim_one(http, queue)  # the queue is empty again for the next round
    finally:
        subscriber.close()
    median = statistics.median(latencies)
    shown = [round(t * 1000) for t in latencies]
    assert median < ANNOUNCE_WITHIN_S, f"median {median * 1000:.0f} ms of {shown} ms"
    print(f"available within {shown} ms of the enqueue")


def test_keep_alive_comments_and_last_event_id(server: LiveServer, http: httpx.Client) -> None:
    idle = Subscriber(server, server.admin_key, "/v1/stream?queue=sse:idle")
    try:
        ready = idle.next(":", timeout=10, data="ready")
        first = idle.next(":", timeout=KEEPALIVE_S * 5, data="keep-alive")
        second = idle.next(":", timeout=KEEPALIVE_S * 5, data="keep-alive")
        for gap in (first.at - ready.at, second.at - first.at):
            assert KEEPALIVE_S * 0.5 < gap < KEEPALIVE_S * 5, gap
    finally:
        idle.close()

    # A reconnect with Last-Event-ID goes on numbering after it.
    enqueue(http, "sse:resume", 1)
    resumed = Subscriber(
        server, server.admin_key, "/v1/stream?queue=sse:resume", headers={"Last-Event-ID": "41"}
    )
    try:
        assert resumed.next("available", timeout=5).id == "42"
    finally:
        resumed.close()


def test_a_last_event_id_that_no_stream_sent_is_400(http: httpx.Client) -> None:
    for sent in (b"7" * 5000, b"\xb2", b"4\xc3\xa9", b"-1", b"1.5"):
        response = http.get("/v1/stream?queue=sse:bad-id", headers={"Last-Event-ID": sent})
        error = problem(response, 400, "invalid_argument")
        assert error["message"].startswith("Last-Event-ID: "), error


def test_claim_true_hands_each_task_to_exactly_one_of_4_subscribers(
    server: LiveServer, http: httpx.Client, sql: psycopg.Connection[Any]
) -> None:
    queue, tasks = "sse:claims", 40
    keys = [new_key(http, 2, ["sse:*"]) for _ in range(4)]
    got: dict[str, list[str]] = {f"sse-key-{key_id}": [] for key_id, _ in keys}
    failures: list[str] = []
    stop = threading.Event()

    def subscribe(key_id: int, key: str) -> None:
        mine = got[f"sse-key-{key_id}"]
        path = f"/v1/stream?queue={queue}&claim=true&credit=1&lease_s=60"
        try:
            with server.http(key) as worker, sse_events(worker, path) as events:
                for kind, event_id, data in events:
                    if kind == "task":
                        task = json.loads(data)
                        assert event_id == str(task["fencing_token"])
                        mine.append(task["task_id"])
                        # The work: a heartbeat, then the result.
                        token = task["lease_token"]
                        assert worker.post("/v1/heartbeat", json={"lease_token": token}).status_code == 200
                        # By task and fencing token: the stream claimed it for this key.
                        done = worker.post("/v1/submit", json={
                            "task_id": task["task_id"], "fencing_token": task["fencing_token"],
                            "result": task["row"],
                        })  # fmt: skip
                        assert done.status_code == 200 and not done.json()["replayed"], done.text
                    if stop.is_set():
                        return
        except Exception as error:  # reported by the main thread
            failures.append(f"{key_id}: {error!r}")

    threads = [threading.Thread(target=subscribe, args=key) for key in keys]
    for thread in threads:
        thread.start()
    try:
        batch = [{"queue": queue, "payload": {"n": n}} for n in range(tasks)]
        assert http.post("/v1/enqueue", json=batch).status_code == 200

        def all_done() -> bool:
            stats = {q["queue"]: q for q in http.get("/v1/queues").json()["queues"]}
            return bool(failures) or stats[queue]["done"] == tasks

        wait_for(all_done, timeout=60, what=f"{tasks} tasks done through the stream")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert not failures, failures

    delivered = [task_id for mine in got.values() for task_id in mine]
    assert len(delivered) == tasks and len(set(delivered)) == tasks, Counter(delivered).most_common(3)
    assert sum(1 for mine in got.values() if mine) >= 2, {w: len(m) for w, m in got.items()}

    rows = sql.execute(
        "SELECT worker, claimed_at, finished_at, attempts FROM batonq.archive"
        " WHERE queue = %s ORDER BY claimed_at",
        [queue],
    ).fetchall()
    assert len(rows) == tasks and {r[3] for r in rows} == {1}, "each task claimed once"
    # credit=1: a subscriber's next task was claimed only after its last one was done.
    for worker in got:
        held = [(claimed, finished) for name, claimed, finished, _ in rows if name == worker]
        for (_, finished), (next_claimed, _) in itertools.pairwise(held):
            assert next_claimed >= finished, f"{worker} held two unfinished tasks"


def test_a_dropped_subscribers_tasks_come_back_after_their_lease(
    server: LiveServer, http: httpx.Client, sql: psycopg.Connection[Any]
) -> None:
    queue = "sse:dropped"
    task_id = enqueue(http, queue, {"n": 1})
    dropped = Subscriber(server, server.admin_key, f"/v1/stream?queue={queue}&claim=true&lease_s=2")
    task = json.loads(dropped.next("task", timeout=10).data)
    assert task["task_id"] == task_id and task["lease_expires_in_s"] <= 2
    dropped.close()  # gone without a submit

    shown = http.get(f"/v1/tasks/{task_id}").json()
    assert (shown.get("state"), shown.get("fencing_token")) == ("leased", task["fencing_token"]), shown
    age(sql, 3)  # the lease runs out; the server's sweeper returns the task
    wait_for(
        lambda: http.get(f"/v1/tasks/{task_id}").json()["state"] == "pending",
        timeout=10,
        what="task back to pending",
    )
    again = claim_one(http, queue, lease_s=60)
    assert again["task_id"] == task_id and again["attempt"] == 2
    assert again["fencing_token"] > task["fencing_token"]
    late = http.post("/v1/submit", json={"lease_token": task["lease_token"], "result": "late"})
    problem(late, 409, "lease_lost")


def test_sigterm_ends_open_streams_cleanly_and_the_server_promptly(server: LiveServer) -> None:
    """The server waits for open responses before it stops; streams, which
    never end by themselves, end as it is told to stop."""
    assert server.admin_key
    subscribers = [
        Subscriber(server, server.admin_key, "/v1/stream?queue=sse:stop"),
        Subscriber(server, server.admin_key, "/v1/stream?queue=sse:stop&claim=true"),
    ]
    for subscriber in subscribers:
        subscriber.next(":", timeout=20, data="ready")
    began = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(timeout=60)
    assert time.monotonic() - began < 10, "batonq serve took over 10 s to stop"
    for subscriber in subscribers:
        subscriber.next("closed", timeout=10)  # fails on an "error": a broken stream


def test_a_database_outage_ends_open_streams_with_an_error_event() -> None:
    """The stream says why it ends (the body a request gets then: 503
    unavailable) and ends as any response does; the log shows no traceback."""
    with private_cluster() as cluster:
        batonq.migrate(cluster.dsn)
        server = LiveServer(cluster.dsn, "--keepalive", str(KEEPALIVE_S))
        try:
            assert server.admin_key
            subscribers = [
                Subscriber(server, server.admin_key, "/v1/stream?queue=sse:outage"),
                Subscriber(server, server.admin_key, "/v1/stream?queue=sse:outage&claim=true"),
            ]
            for subscriber in subscribers:
                subscriber.next(":", timeout=20, data="ready")
            with server.http(server.admin_key) as http:
                unavailable = http.get("/readyz")
                cluster.stop()
                unavailable = http.get("/v1/queues")
            body = problem(unavailable, 503, "unavailable")
            for subscriber in subscribers:
                event = subscriber.next("error", timeout=30)
                assert event.data.startswith("{") and json.loads(event.data) == {"error": body}, event
                subscriber.next("closed", timeout=10)  # the end of the response, not a broken one
            assert "Traceback" not in server.log, server.log
        finally:
            server.stop()
            cluster.start()
