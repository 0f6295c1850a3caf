"""Clients written for Teleon's and Pigeonhole's queues work unchanged over
HTTP: Teleon's claim and submit bodies byte for byte, writes by fencing token
from the key that claimed, Pigeonhole's argument names, and the writes a late
worker had refused, readable without SQL."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from tests.conftest import age
from tests.e2e.live import LiveServer, claim_one, enqueue, new_key, problem
from tests.e2e.seeds import TELEON_CLAIM, TELEON_CLAIMED, TELEON_SUBMIT, compact

import batonq

Sql = psycopg.Connection[tuple[Any, ...]]
JSON_BODY = {"Content-Type": "application/json"}
BATONQ = Path(sys.executable).with_name("batonq")


def worker(server: LiveServer, http: httpx.Client) -> httpx.Client:
    """A keep-alive client with a new ring-2 key."""
    return server.http(new_key(http, 2)[1])


def test_teleon_claims_and_submits_word_for_word(server: LiveServer, http: httpx.Client, sql: Sql) -> None:
    # The ids of the documented example: the next task is t_5521, the next token 1180.
    sql.execute("SELECT setval('batonq.task_id_seq', 5520), setval('batonq.fencing_seq', 1179)")
    assert http.patch("/v1/queues/aq17_hybrid_search", json={"lease_s": 600}).status_code == 200
    assert enqueue(http, "aq17_hybrid_search", {"query": "openapi to mcp server"}) == "t_5521"

    with worker(server, http) as w31:
        claimed = w31.post("/v1/claim", content=TELEON_CLAIM, headers=JSON_BODY)
        assert claimed.status_code == 200, claimed.text
        # The documented response, byte for byte, then batonq's own fields.
        assert claimed.content.startswith(compact(TELEON_CLAIMED)[:-1] + b","), claimed.text
        body = claimed.json()
        assert list(body)[:4] == ["task_id", "fencing_token", "lease_expires_in_s", "row"]
        assert body["lease_token"].startswith("aq17_hybrid_search/5521/1180/")
        assert (body["attempt"], body["queue"], body["root_id"]) == (1, "aq17_hybrid_search", "t_5521")

        submitted = w31.post("/v1/submit", content=TELEON_SUBMIT, headers=JSON_BODY)
        assert submitted.status_code == 200, submitted.text
        assert (
            submitted.content == b'{"task_id":"t_5521","state":"done","replayed":false,"fencing_token":1180}'
        )
        again = w31.post("/v1/submit", content=TELEON_SUBMIT, headers=JSON_BODY)
        assert again.json() == {"task_id": "t_5521", "state": "done", "replayed": True, "fencing_token": 1180}

    task = http.get("/v1/tasks/t_5521").json()
    assert (task["state"], task["result"], task["worker"]) == (
        "done",
        json.loads(TELEON_SUBMIT)["result"],
        "w_31",
    )


def test_an_empty_one_task_claim_answers_null_fields(http: httpx.Client) -> None:
    empty = http.post("/v1/claim", json={"queue": "nothing:here", "max_tasks": 1})
    assert empty.json() == {"task_id": None, "fencing_token": None, "lease_expires_in_s": None, "row": None}
    assert http.post("/v1/claim", json={"queue": "nothing:here", "max_tasks": 2}).json() == {"tasks": []}


def test_a_batch_claim_answers_a_list_of_tasks_in_the_same_shape(http: httpx.Client) -> None:
    for n in range(3):
        enqueue(http, "teleon:batch", {"n": n})
    single = claim_one(http, "teleon:batch")
    batch = http.post("/v1/claim", json={"queue": "teleon:batch", "max_tasks": 5}).json()["tasks"]
    assert [task["row"] for task in batch] == [{"n": 1}, {"n": 2}]
    assert [list(task) for task in batch] == [list(single)] * 2


def forged(task: dict[str, Any]) -> str:
    """A lease token naming the task's lease, with a secret nobody was given."""
    return f"{task['queue']}/{task['task_id'][2:]}/{task['fencing_token']}/{uuid.uuid4().hex}"


WRITES = [
    ("/v1/submit", {"result": {"by": "someone else"}}),
    ("/v1/fail", {"error": "not mine", "requeue": False}),
    ("/v1/heartbeat", {"lease_s": 3600}),
    ("/v1/release", {}),
]


def test_writes_by_fencing_token_are_taken_from_the_claiming_key_only(
    server: LiveServer, http: httpx.Client
) -> None:
    with worker(server, http) as mine, worker(server, http) as other:
        enqueue(http, "fenced", {"job": 1})
        task = claim_one(mine, "fenced", lease_s=60)
        named = {"task_id": task["task_id"], "fencing_token": task["fencing_token"]}

        # Another key (a worker's, the admin's) naming the lease by its fencing
        # token is refused exactly as a forged lease token is, for every write.
        for path, fields in WRITES:
            as_forged = mine.post(path, json={"lease_token": forged(task), **fields})
            error = problem(as_forged, 400, "invalid_token")
            assert error["message"] == f"wrong lease token for task {task['task_id'][2:]}"
            for stranger in (other, http):
                refused = stranger.post(path, json={**named, **fields})
                assert (refused.status_code, refused.json()) == (400, as_forged.json()), path
        shown = http.get(f"/v1/tasks/{task['task_id']}").json()
        assert (shown["state"], shown["fencing_token"], shown["attempts"]) == (
            "leased",
            task["fencing_token"],
            1,
        )

        # The claiming key: heartbeat, fail, and (once claimed again) submit.
        beat = mine.post("/v1/heartbeat", json={**named, "lease_s": 120, "stage": "half way"})
        assert beat.status_code == 200 and beat.json()["lease_expires_in_s"] > 100, beat.text
        failed = mine.post("/v1/fail", json={**named, "error": "flaky", "retry_delay_s": 0})
        assert failed.json()["state"] == "pending", failed.text
        # The fail, repeated by the same key while the task waits, is its replay.
        repeated = mine.post("/v1/fail", json={**named, "error": "flaky", "retry_delay_s": 0})
        assert repeated.json() == {**failed.json(), "replayed": True}, repeated.text
        again = claim_one(mine, "fenced")
        assert again["fencing_token"] > task["fencing_token"]

        # The old token is late: refused as lease_lost, from any key, by either form.
        late = mine.post("/v1/heartbeat", json=named)
        assert problem(late, 409, "lease_lost")["current_fencing_token"] == again["fencing_token"]
        late_forged = mine.post("/v1/heartbeat", json={"lease_token": forged(task)})
        late_other = other.post("/v1/heartbeat", json=named)
        assert late_forged.json() == late_other.json() == late.json()
        # A complete under the token a fail was accepted with is not that
        # fail again: refused, as late.
        not_a_replay = mine.post("/v1/submit", json={**named, "result": "late"})
        assert problem(not_a_replay, 409, "lease_lost")["current_fencing_token"] == again["fencing_token"]

        newest = {"task_id": again["task_id"], "fencing_token": again["fencing_token"]}
        done = mine.post("/v1/submit", json=[{**newest, "result": {"ok": True}}])
        assert done.json()["results"][0]["outcome"] == "accepted", done.text
        replay = mine.post("/v1/submit", json={**newest, "result": {"ok": True}})
        assert replay.json()["replayed"] is True
    assert http.get(f"/v1/tasks/{task['task_id']}").json()["result"] == {"ok": True}


def test_a_lease_claimed_without_a_key_takes_its_lease_token_only(
    server: LiveServer, http: httpx.Client, admin_dsn: str
) -> None:
    enqueue(http, "keyless", {"job": 1})
    with batonq.connect(admin_dsn, listen=False) as client:
        [lease] = client.claim("keyless")
    named = {"task_id": f"t_{lease.task_id}", "fencing_token": lease.fencing_token}
    problem(http.post("/v1/submit", json={**named, "result": 1}), 400, "invalid_token")
    # The lease token works across keys: it is the lease's own proof.
    with worker(server, http) as any_worker:
        done = any_worker.post("/v1/submit", json={"lease_token": lease.lease_token, "result": 2})
    assert done.json()["state"] == "done", done.text


def test_a_task_outside_the_keys_scopes_is_not_found_by_fencing_token(
    server: LiveServer, http: httpx.Client
) -> None:
    enqueue(http, "mail:outbox", 1)
    task = claim_one(http, "mail:outbox")
    with server.http(new_key(http, 2, ["shop:*"])[1]) as shop:
        answer = shop.post(
            "/v1/submit", json={"task_id": task["task_id"], "fencing_token": task["fencing_token"]}
        )
        assert problem(answer, 404, "task_not_found")["message"] == f"task {task['task_id']} not found"
        gone = shop.post("/v1/submit", json={"task_id": "t_999999", "fencing_token": 1})
        assert problem(gone, 404, "task_not_found")["message"] == "task t_999999 not found"


def test_a_write_names_its_lease_one_way(http: httpx.Client) -> None:
    enqueue(http, "oneway", 1)
    task = claim_one(http, "oneway")
    both = {
        "lease_token": task["lease_token"],
        "task_id": task["task_id"],
        "fencing_token": task["fencing_token"],
    }
    error = problem(http.post("/v1/submit", json=both), 422, "invalid_request")
    assert error["message"] == "task_id: Extra inputs are not permitted"
    half = problem(http.post("/v1/submit", json={"task_id": task["task_id"]}), 422, "invalid_request")
    assert half["message"] == "fencing_token: Field required"


def seconds_until(stamp: str) -> float:
    return (datetime.fromisoformat(stamp) - datetime.now().astimezone()).total_seconds()


def test_pigeonholes_argument_names_are_taken(http: httpx.Client) -> None:
    later = http.post("/v1/enqueue", json={"queue": "shop:tasks", "payload": 1, "delay_seconds": 3600})
    assert 3500 < seconds_until(later.json()["run_at"]) <= 3600, later.text
    nothing = {"task_id": None, "fencing_token": None, "lease_expires_in_s": None, "row": None}
    assert http.post("/v1/claim", json={"queue": "shop:tasks", "wait_seconds": 0.2}).json() == nothing

    enqueue(http, "shop:tasks", {"shard": 7}, idempotency_key="shard-07")
    task = claim_one(http, "shop:tasks", lease_seconds=1200)
    assert task["lease_expires_in_s"] == 1200
    beat = http.post("/v1/heartbeat", json={"lease_token": task["lease_token"], "lease_seconds": 1800})
    assert beat.json()["lease_expires_in_s"] > 1700, beat.text
    retry = http.post("/v1/fail", json={"lease_token": task["lease_token"], "retry_delay_seconds": 600})
    assert retry.json()["state"] == "pending", retry.text
    assert 500 < seconds_until(http.get(f"/v1/tasks/{task['task_id']}").json()["run_at"]) <= 600

    enqueue(http, "shop:tasks", {"shard": 8})
    doomed = claim_one(http, "shop:tasks")
    http.post("/v1/fail", json={"lease_token": doomed["lease_token"], "error": "no", "requeue": False})
    dead = http.get("/v1/tasks", params={"queue": "shop:tasks", "status": "dead"}).json()["tasks"]
    assert [t["task_id"] for t in dead] == [doomed["task_id"]]


def test_argument_names_and_ranges_are_checked(http: httpx.Client) -> None:
    cases = [
        ({"queue": "q", "lease_seconds": 7200}, "lease_seconds must be between 1 and 3600 (got 7200)"),
        ({"queue": "q", "lease_s": 0}, "lease_s must be between 1 and 3600 (got 0)"),
        ({"queue": "q", "wait_seconds": 56}, "wait_seconds must be between 0 and 55 (got 56)"),
        ({"queue": "q", "lease_s": 60, "lease_seconds": 60}, "give lease_s or lease_seconds, not both"),
        ({"queue": "q", "lease_secs": 60}, "lease_secs: Extra inputs are not permitted"),
    ]
    for body, message in cases:
        assert problem(http.post("/v1/claim", json=body), 422, "invalid_request")["message"] == message
    # Too many at once is not malformed but too large, like the other list caps.
    many = problem(http.post("/v1/claim", json={"queue": "q", "max_tasks": 5000}), 413, "too_many_items")
    assert many["message"] == "max_tasks 5000: claim at most 1000 tasks per request"
    late = {"queue": "q", "payload": 1, "delay_seconds": -1}
    assert problem(http.post("/v1/enqueue", json=late), 422, "invalid_request")["message"] == (
        "delay_seconds must be between 0 and 315360000 (got -1)"
    )
    both = problem(http.get("/v1/tasks", params={"queue": "q", "state": "dead", "status": "done"}), 400,
                   "invalid_argument")  # fmt: skip
    assert both["message"] == "give state or status, not both"


def test_writes_set_aside_are_shown_with_who_held_the_lease(
    server: LiveServer, http: httpx.Client, sql: Sql, admin_dsn: str
) -> None:
    slow_id, slow_key = new_key(http, 2)
    fast_id, fast_key = new_key(http, 2)
    task_id = enqueue(http, "late:q", {"n": 1})
    with server.http(slow_key) as slow, server.http(fast_key) as fast:
        first = claim_one(slow, "late:q", worker="w_30", lease_s=30)
        age(sql, 60)  # the slow worker's lease ran out
        second = claim_one(fast, "late:q", worker="w_31")
        late = slow.post("/v1/submit", json={"task_id": task_id, "fencing_token": first["fencing_token"]})
        problem(late, 409, "lease_lost")
        beat = slow.post("/v1/heartbeat", json={"lease_token": first["lease_token"]})
        problem(beat, 409, "lease_lost")
        assert (
            fast.post("/v1/submit", json={"lease_token": second["lease_token"], "result": 1}).status_code
            == 200
        )

    shown = http.get(f"/v1/tasks/{task_id}").json()
    assert [
        (w["kind"], w["fencing_token"], w["state"], w["worker"], w["key_id"]) for w in shown["set_aside"]
    ] == [
        ("complete", first["fencing_token"], "leased", "w_30", slow_id),
        ("heartbeat", first["fencing_token"], "leased", "w_30", slow_id),
    ]
    assert shown["set_aside"][0]["task_id"] == task_id and shown["set_aside"][0]["at"]
    assert fast_id != slow_id

    run = subprocess.run([str(BATONQ), "--dsn", admin_dsn, "task", task_id], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "  set aside\n" in run.stdout
    assert f"    complete (fencing token {first['fencing_token']}) at " in run.stdout
    assert f": refused, the task was leased; lease held by w_30 (key {slow_id})\n" in run.stdout
    as_json = subprocess.run(
        [str(BATONQ), "--dsn", admin_dsn, "task", task_id, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    listed = json.loads(as_json.stdout)["set_aside"]
    assert [(w["kind"], w["worker"], w["key_id"]) for w in listed] == [
        ("complete", "w_30", slow_id), ("heartbeat", "w_30", slow_id),
    ]  # fmt: skip
