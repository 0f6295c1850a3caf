"""Flow control over HTTP against a real ``batonq serve``: schedules (scoped
like queues), debounced enqueue, the settings audit naming the API key, and
pause stopping claims and long-polls at once."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
from tests.e2e.conftest import KEEPALIVE_S
from tests.e2e.live import LiveServer, Subscriber, claim, enqueue, problem


def test_schedules_are_added_listed_paused_and_removed_within_scopes(
    server: LiveServer, http: httpx.Client
) -> None:
    body = {"name": "nightly", "cron": "30 2 * * *", "queue": "reports", "payload": {"k": 1}}
    body["tz"] = "Europe/Berlin"
    added = http.post("/v1/schedules", json=body)
    assert added.status_code == 200, added.text
    assert {k: added.json()[k] for k in ("cron", "tz", "missed", "paused")} == {
        "cron": "30 2 * * *", "tz": "Europe/Berlin", "missed": "fire-once", "paused": False,
    }  # fmt: skip
    problem(http.post("/v1/schedules", json={**body, "cron": "nope"}), 400, "invalid_argument")
    assert http.post("/v1/schedules/nightly/pause").json()["paused"] is True

    made = http.post("/v1/keys", json={"ring": 0, "queues": ["shop:*"]}).json()
    with server.http(made["key"]) as other:
        assert other.get("/v1/schedules").json() == {"schedules": []}
        problem(other.post("/v1/schedules/nightly/resume"), 404, "schedule_not_found")
        problem(other.post("/v1/schedules", json=body), 403, "forbidden")

    [listed] = http.get("/v1/schedules").json()["schedules"]
    assert (listed["name"], listed["paused"]) == ("nightly", True)
    assert http.delete("/v1/schedules/nightly").status_code == 204
    problem(http.delete("/v1/schedules/nightly"), 404, "schedule_not_found")

    entries = http.get("/v1/audit", params={"kind": "schedule", "name": "nightly"}).json()["entries"]
    assert [(e["before"] is None, e["after"] is None) for e in reversed(entries)] == [
        (True, False), (False, False), (False, True),
    ]  # fmt: skip
    assert {e["actor"] for e in entries} == {"key:1"}


def test_debounced_enqueue_over_http(http: httpx.Client) -> None:
    fields = {"debounce_key": "user-7", "debounce_s": 60}
    first = http.post("/v1/enqueue", json={"queue": "digest", "payload": {"n": 1}, **fields}).json()
    second = http.post("/v1/enqueue", json={"queue": "digest", "payload": {"n": 2}, **fields}).json()
    assert (first["created"], second["created"], second["task_id"]) == (True, False, first["task_id"])
    assert http.get(f"/v1/tasks/{first['task_id']}").json()["payload"] == {"n": 2}
    many = [{"queue": "digest", "payload": {}, **fields}]
    problem(http.post("/v1/enqueue", json=many), 400, "invalid_argument")


def test_pause_stops_claims_and_long_polls_at_once(http: httpx.Client) -> None:
    enqueue(http, "shop:paused", {"n": 1})
    settings = http.patch("/v1/queues/shop:paused", json={"paused": True})
    assert settings.json()["paused"] is True
    shown = http.get("/v1/queues/shop:paused/settings").json()
    assert (shown["paused"], shown["lease_s"], shown["max_attempts"]) == (True, 300, 3)
    problem(http.get("/v1/queues/shop:none/settings"), 404, "queue_not_found")
    assert claim(http, "shop:paused") == []
    got: list[Any] = []
    started = time.monotonic()
    poll = threading.Thread(target=lambda: got.append(claim(http, "shop:paused", wait_s=30)))
    poll.start()
    time.sleep(1.5)  # the long-poll is waiting on a paused queue with a task in it
    assert got == []
    http.patch("/v1/queues/shop:paused", json={"paused": False})
    poll.join(timeout=30)
    [[task]] = got
    assert task["row"] == {"n": 1}
    assert time.monotonic() - started < 15  # woken by the resume, not by the end of its wait
    [changed, _] = http.get("/v1/audit", params={"kind": "queue", "name": "shop:paused", "limit": 2}).json()[
        "entries"
    ]
    assert changed["actor"] == "key:1" and changed["after"]["paused"] is False


def test_the_stream_announces_no_work_in_a_paused_queue(server: LiveServer, http: httpx.Client) -> None:
    http.patch("/v1/queues/sse:paused", json={"paused": True})
    enqueue(http, "sse:paused", {"n": 1})
    subscriber = Subscriber(server, server.admin_key, "/v1/stream?queue=sse:paused")
    try:
        subscriber.next(":", timeout=10, data="ready")
        # Everything up to the second keep-alive: no announcement among it.
        heard = [subscriber.events.get(timeout=KEEPALIVE_S * 5)]
        while sum(e.data == "keep-alive" for e in heard) < 2:
            heard.append(subscriber.events.get(timeout=KEEPALIVE_S * 5))
        assert [e.kind for e in heard] == [":"] * len(heard)
        http.patch("/v1/queues/sse:paused", json={"paused": False})
        announced = subscriber.next("available", timeout=10)
        assert json.loads(announced.data) == {"queue": "sse:paused", "pending": 1}
    finally:
        subscriber.close()
