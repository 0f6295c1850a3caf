"""Flow control over HTTP against a real ``batonq serve``: schedules (scoped
like queues), debounced enqueue, the settings audit naming the API key,
pause stopping claims and long-polls at once, the limits set and shown, and
a task's group on every view of it."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx
from tests.e2e.conftest import KEEPALIVE_S
from tests.e2e.live import LiveServer, Subscriber, claim, enqueue, problem

from batonq.limits import MAX_GROUP_LENGTH


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
        # A name outside its scopes, on a queue it covers: refused without
        # naming the other queue, and the same whether the name is taken or not.
        error = problem(other.post("/v1/schedules", json={**body, "queue": "shop:x"}), 403, "forbidden")
        assert error["message"] == "this key may not name a schedule 'nightly'"
        unused = {**body, "name": "unused", "queue": "shop:x"}
        error = problem(other.post("/v1/schedules", json=unused), 403, "forbidden")
        assert error["message"] == "this key may not name a schedule 'unused'"

    [listed] = http.get("/v1/schedules").json()["schedules"]
    assert (listed["name"], listed["paused"]) == ("nightly", True)
    assert http.delete("/v1/schedules/nightly").status_code == 204
    problem(http.delete("/v1/schedules/nightly"), 404, "schedule_not_found")

    entries = http.get("/v1/audit", params={"kind": "schedule", "name": "nightly"}).json()["entries"]
    assert [(e["before"] is None, e["after"] is None) for e in reversed(entries)] == [
        (True, False), (False, False), (False, True),
    ]  # fmt: skip
    assert {e["actor"] for e in entries} == {"key:1"}


def test_a_scoped_keys_audit_pages_past_other_queues_and_hides_what_it_does_not_cover(
    server: LiveServer, http: httpx.Client
) -> None:
    http.patch("/v1/queues/shop:audited", json={"lease_s": 30})
    for n in range(1, 56):  # newer than shop's entry: another queue's
        assert http.patch("/v1/queues/audit:other", json={"lease_s": n}).status_code == 200
    moved = {"name": "moved", "cron": "0 * * * *", "queue": "audit:secret", "payload": {"secret": 1}}
    assert http.post("/v1/schedules", json=moved).status_code == 200
    assert http.post("/v1/schedules", json={**moved, "queue": "shop:audited"}).status_code == 200

    made = http.post("/v1/keys", json={"ring": 0, "queues": ["shop:*"]}).json()
    with server.http(made["key"]) as scoped:
        page = scoped.get("/v1/audit", params={"limit": 1000}).json()
        # The moved schedule's entries name audit:secret: not shown.
        assert {e["name"] for e in page["entries"]} == {"shop:audited"}
        assert page["next_before_id"] is None
        # A page too short to reach shop's entry in ten reads ends with a cursor to go on from.
        page = scoped.get("/v1/audit", params={"limit": 1, "kind": "queue"}).json()
        assert page["entries"] == [] and page["next_before_id"] is not None
        seen = []
        while page["next_before_id"] is not None:
            params = {"limit": 1, "kind": "queue", "before_id": page["next_before_id"]}
            page = scoped.get("/v1/audit", params=params).json()
            seen += [e["name"] for e in page["entries"]]
        assert set(seen) == {"shop:audited"}


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


def test_limits_are_set_shown_and_removed_over_http(http: httpx.Client) -> None:
    limits = {"max_leased": 3, "group_max_leased": 1, "rate_limit": 20, "group_rate_limit": 5}
    limits["rate_period_s"] = 2
    changed = http.patch("/v1/queues/shop:limited", json=limits)
    assert changed.status_code == 200, changed.text
    shown = http.get("/v1/queues/shop:limited/settings").json()
    assert {k: shown[k] for k in limits} == limits
    removed = {"max_leased": 0, "rate_limit": 0, "group_rate_limit": 0}
    cleared = http.patch("/v1/queues/shop:limited", json=removed).json()
    names = ("max_leased", "group_max_leased", "rate_limit", "group_rate_limit")
    assert [cleared[name] for name in names] == [None, 1, None, None]
    problem(http.patch("/v1/queues/shop:limited", json={"max_leased": -1}), 422, "invalid_request")
    problem(http.patch("/v1/queues/shop:limited", json={"group_rate_limit": -1}), 422, "invalid_request")
    for period in (0, 1e-300, 5e-324):  # under a millisecond: the buckets' arithmetic would overflow
        refused = http.patch("/v1/queues/shop:limited", json={"rate_period_s": period})
        problem(refused, 422, "invalid_request")
        assert "must be between 0.001 and 86400" in refused.json()["error"]["message"]
    [change, *_] = http.get("/v1/audit", params={"kind": "queue", "name": "shop:limited"}).json()["entries"]
    assert (change["before"]["max_leased"], change["after"]["max_leased"]) == (3, None)


def test_a_group_travels_from_enqueue_to_every_view(server: LiveServer, http: httpx.Client) -> None:
    http.patch("/v1/queues/shop:groups", json={"group_max_leased": 1})
    one = enqueue(http, "shop:groups", {"n": 1}, group="acme", delay_seconds=0)  # a seeds' alias still works
    many = http.post("/v1/enqueue", json=[
        {"queue": "shop:groups", "payload": {"n": 2}, "group": "acme"},
        {"queue": "shop:groups", "payload": {"n": 3}, "group": "globex", "delay_s": 0},
        {"queue": "shop:groups", "payload": {"n": 4}},
    ])  # fmt: skip
    assert many.status_code == 200, many.text
    ids = [one, *(t["task_id"] for t in many.json()["tasks"])]
    assert http.get(f"/v1/tasks/{one}").json()["group"] == "acme"
    listed = http.get("/v1/tasks", params={"queue": "shop:groups"}).json()["tasks"]
    groups = ["acme", "acme", "globex", None]
    assert {t["task_id"]: t["group"] for t in listed} == dict(zip(ids, groups, strict=True))
    problem(http.post("/v1/enqueue", json={"queue": "q", "payload": 1, "group": ""}), 422, "invalid_request")

    # One per group: acme's second task waits while its first is leased.
    claimed = claim(http, "shop:groups", max_tasks=10)
    assert sorted((t["row"]["n"], t["group"]) for t in claimed) == [(1, "acme"), (3, "globex"), (4, None)]
    subscriber = Subscriber(server, server.admin_key, "/v1/stream?queue=shop:groups&claim=true&lease_s=60")
    try:
        subscriber.next(":", timeout=10, data="ready")
        submitted = http.post("/v1/submit", json=[{"lease_token": t["lease_token"]} for t in claimed])
        assert submitted.status_code == 200, submitted.text
        task = json.loads(subscriber.next("task", timeout=10).data)
    finally:
        subscriber.close()
    assert (task["task_id"], task["group"]) == (ids[1], "acme")


def test_openapi_shows_the_limits_and_the_group(server: LiveServer) -> None:
    with server.http() as anonymous:
        schemas = anonymous.get("/openapi.json").json()["components"]["schemas"]
    for model in ("QueueSettingsIn", "QueueSettingsOut"):
        fields = schemas[model]["properties"]
        limits = {"max_leased", "group_max_leased", "rate_limit", "group_rate_limit", "rate_period_s"}
        assert limits <= set(fields), model
    assert "0 removes it" in schemas["QueueSettingsIn"]["properties"]["max_leased"]["description"]
    for model in ("EnqueueIn", "TaskOut", "ClaimedTask"):
        assert "group" in schemas[model]["properties"], model
    group = schemas["EnqueueIn"]["properties"]["group"]["anyOf"][0]
    assert (group["minLength"], group["maxLength"]) == (1, MAX_GROUP_LENGTH)


def test_the_dashboard_names_a_queues_limits_and_its_tasks_groups(
    server: LiveServer, http: httpx.Client
) -> None:
    limits = {"max_leased": 2, "rate_limit": 5, "group_rate_limit": 1, "rate_period_s": 60}
    http.patch("/v1/queues/ui:limited", json=limits)
    grouped = enqueue(http, "ui:limited", {"n": 1}, group="acme")
    plain_task = enqueue(http, "ui:plain", {"n": 1})
    with httpx.Client(base_url=server.url, timeout=30.0) as browser:
        form = browser.get("/ui/login")
        token = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert token, form.text
        signed = browser.post(
            "/ui/login", data={"key": server.admin_key, "csrf": token[1]}, follow_redirects=True
        )
        assert signed.status_code == 200, signed.text
        limited = browser.get("/ui/tasks", params={"queue": "ui:limited"}).text
        plain = browser.get("/ui/tasks", params={"queue": "ui:plain"}).text
        grouped_page = browser.get(f"/ui/tasks/{grouped}").text
        plain_page = browser.get(f"/ui/tasks/{plain_task}").text
    assert "Limits: at most 2 leased · 5 claims per 60 s · 1 claims per 60 s per group" in limited
    assert '<th scope="col">Group</th>' in limited and "<td>acme</td>" in limited
    assert "Limits:" not in plain and "Group" not in plain  # no task of ui:plain has a group
    assert "<div><dt>Group</dt><dd>acme</dd></div>" in grouped_page and "<dt>Group</dt>" not in plain_page
