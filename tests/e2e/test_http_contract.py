"""The seed contract over HTTP, against a real ``batonq serve``: enqueue,
claim, submit; a late submit from an older lease is refused with 409
lease_lost (with the task's state and token) and the newer lease stands; a
repeated submit gives the same answer with ``replayed: true``."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import psycopg
from tests.conftest import age
from tests.e2e.live import LiveServer, claim_one, enqueue, problem

Q = "shop:orders"


def task(http: httpx.Client, task_id: str) -> dict[str, Any]:
    response = http.get(f"/v1/tasks/{task_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def test_enqueue_claim_submit(http: httpx.Client, sql: psycopg.Connection[Any]) -> None:
    task_id = enqueue(http, Q, {"order": 17}, idempotency_key="order-17")
    assert task_id.startswith("t_")

    lease = claim_one(http, Q, worker="w1", lease_s=60)
    assert lease["task_id"] == task_id
    assert lease["attempt"] == 1 and lease["row"] == {"order": 17}
    assert 0 < lease["lease_expires_in_s"] <= 60
    nothing = {"task_id": None, "fencing_token": None, "lease_expires_in_s": None, "row": None}
    assert http.post("/v1/claim", json={"queue": Q}).json() == nothing, "one holder"

    done = http.post("/v1/submit", json={"lease_token": lease["lease_token"], "result": {"shipped": True}})
    assert done.status_code == 200, done.text
    assert done.json() == {
        "task_id": task_id, "state": "done", "replayed": False, "fencing_token": lease["fencing_token"],
    }  # fmt: skip

    shown = task(http, task_id)
    assert (shown["state"], shown["result"], shown["worker"]) == ("done", {"shipped": True}, "w1")
    assert "lease_token" not in shown, "no listing shows a lease token"
    # A repeat is answered from the archive and recorded as a replay.
    again = http.post("/v1/submit", json={"lease_token": lease["lease_token"], "result": {"shipped": True}})
    assert again.status_code == 200, again.text
    assert again.json()["replayed"] is True
    ledger = sql.execute(
        "SELECT kind, outcome FROM batonq.submits WHERE task_id = %s", [int(task_id[2:])]
    ).fetchall()
    assert ledger == [("complete", "replayed")]


def test_a_late_submit_is_refused_and_the_newer_lease_stands(
    http: httpx.Client, sql: psycopg.Connection[Any]
) -> None:
    task_id = enqueue(http, Q, {"order": 18})
    old = claim_one(http, Q, worker="slow", lease_s=30)
    age(sql, 31)  # the old lease runs out...
    new = claim_one(http, Q, worker="fast", lease_s=60)  # ...and another worker claims the task
    assert new["task_id"] == task_id and new["attempt"] == 2
    assert new["fencing_token"] > old["fencing_token"]

    late = http.post("/v1/submit", json={"lease_token": old["lease_token"], "result": {"by": "slow"}})
    error = problem(late, 409, "lease_lost")
    assert error["task_id"] == task_id
    assert error["state"] == "leased"
    assert error["fencing_token"] == old["fencing_token"]
    assert error["current_fencing_token"] == new["fencing_token"]
    # The refused write is set aside in the ledger for audit; the task is untouched.
    assert task(http, task_id)["state"] == "leased"
    set_aside = sql.execute(
        "SELECT fencing_token, outcome FROM batonq.submits WHERE task_id = %s", [int(task_id[2:])]
    ).fetchall()
    assert set_aside == [(old["fencing_token"], "set_aside")]

    # The newer lease stands: its submit is accepted.
    done = http.post("/v1/submit", json={"lease_token": new["lease_token"], "result": {"by": "fast"}})
    assert done.status_code == 200, done.text
    assert done.json()["replayed"] is False
    assert task(http, task_id)["result"] == {"by": "fast"}

    # Late again, now that the task is done: still 409, and the body says done.
    again = problem(
        http.post("/v1/fail", json={"lease_token": old["lease_token"], "error": "too late"}),
        409,
        "lease_lost",
    )
    assert (again["state"], again["current_fencing_token"]) == ("done", new["fencing_token"])
    assert task(http, task_id)["result"] == {"by": "fast"}


def test_a_repeated_submit_gets_the_same_answer_replayed(http: httpx.Client) -> None:
    task_id = enqueue(http, Q, {"order": 19})
    lease = claim_one(http, Q, lease_s=60)
    body = {"lease_token": lease["lease_token"], "result": {"n": 1}}
    first = http.post("/v1/submit", json=body)
    assert first.status_code == 200, first.text
    for result in ({"n": 1}, {"n": 2}):  # the same submit, and one with another result
        repeat = http.post("/v1/submit", json={**body, "result": result})
        assert repeat.status_code == 200, repeat.text
        assert repeat.json() == {**first.json(), "replayed": True}
    assert task(http, task_id)["result"] == {"n": 1}, "a replay changes nothing"


def test_heartbeat_fail_and_release_over_http(http: httpx.Client) -> None:
    task_id = enqueue(http, Q, {"order": 20}, max_attempts=2)
    lease = claim_one(http, Q, lease_s=5)
    beat = http.post(
        "/v1/heartbeat", json={"lease_token": lease["lease_token"], "lease_s": 600, "stage": "packing"}
    )
    assert beat.status_code == 200, beat.text
    assert beat.json()["task_id"] == task_id and beat.json()["lease_expires_in_s"] > 500
    assert task(http, task_id)["stage"] == "packing"

    failed = http.post(
        "/v1/fail", json={"lease_token": lease["lease_token"], "error": "no stock", "retry_delay_s": 0}
    )
    assert failed.status_code == 200, failed.text
    assert failed.json()["state"] == "pending"

    second = claim_one(http, Q, lease_s=60)
    assert second["attempt"] == 2
    released = http.post("/v1/release", json={"lease_token": second["lease_token"]})
    assert released.status_code == 200 and released.json()["state"] == "pending"

    third = claim_one(http, Q, lease_s=60)
    dead = http.post(
        "/v1/fail", json={"lease_token": third["lease_token"], "error": {"why": "gone"}, "requeue": False}
    )
    assert dead.json()["state"] == "dead"
    shown = task(http, task_id)
    assert shown["state"] == "dead" and len(shown["errors"]) >= 2
    retried = http.post(f"/v1/tasks/{task_id}/retry")
    assert retried.status_code == 200 and retried.json()["state"] == "pending"


def test_idempotent_enqueue_and_enqueue_many(http: httpx.Client) -> None:
    first = http.post("/v1/enqueue", json={"queue": Q, "payload": 1}, headers={"Idempotency-Key": "k-1"})
    again = http.post("/v1/enqueue", json={"queue": Q, "payload": 2}, headers={"Idempotency-Key": "k-1"})
    assert first.json()["created"] is True
    assert again.json()["created"] is False and again.json()["task_id"] == first.json()["task_id"]

    many = http.post("/v1/enqueue", json=[
        {"queue": Q, "payload": {"i": 0}, "idempotency_key": "m-0"},
        {"queue": "mail:outbox", "payload": {"i": 1}, "priority": 5},
        {"queue": Q, "payload": {"i": 2}, "idempotency_key": "k-1"},
    ])  # fmt: skip
    assert many.status_code == 200, many.text
    tasks = many.json()["tasks"]
    assert [t["queue"] for t in tasks] == [Q, "mail:outbox", Q]
    assert [t["created"] for t in tasks] == [True, True, False]
    assert tasks[2]["task_id"] == first.json()["task_id"]


def test_a_long_poll_claim_returns_when_work_arrives(server: LiveServer, http: httpx.Client) -> None:
    answers: list[tuple[float, httpx.Response]] = []

    def long_poll() -> None:
        with server.http(server.admin_key) as other:
            started = time.monotonic()
            response = other.post("/v1/claim", json={"queue": "poll", "wait_s": 20})
            answers.append((time.monotonic() - started, response))

    poller = threading.Thread(target=long_poll)
    poller.start()
    task_id = enqueue(http, "poll", {"wake": "up"})
    poller.join(timeout=30)
    assert answers, "the long-poll did not return"
    took, response = answers[0]
    assert response.status_code == 200, response.text
    assert response.json()["task_id"] == task_id
    assert took < 10, f"woken by the enqueue, not by the end of wait_s ({took:.2f} s)"


def test_a_list_submit_answers_each_item(http: httpx.Client, sql: psycopg.Connection[Any]) -> None:
    for n in range(3):
        enqueue(http, "batch", {"n": n})
    leases = http.post("/v1/claim", json={"queue": "batch", "max_tasks": 3, "lease_s": 30}).json()["tasks"]
    assert len(leases) == 3
    age(sql, 31)
    again = claim_one(http, "batch", lease_s=60)  # one of the three, claimed anew after its lease ran out
    stale = next(lease for lease in leases if lease["task_id"] == again["task_id"])
    fresh = [lease for lease in leases if lease is not stale]
    items = [
        {"lease_token": lease["lease_token"], "result": lease["row"]} for lease in [*fresh, stale]
    ]
    answer = http.post("/v1/submit", json=items)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["task_id"] for r in results] == [lease["task_id"] for lease in [*fresh, stale]]
    # The two leases nobody took since are accepted (a lease that ran out may still complete);
    # the one claimed anew is refused, and says by whom.
    assert [r["outcome"] for r in results] == ["accepted", "accepted", "lease_lost"]
    assert results[2]["state"] == "leased" and results[2]["current_fencing_token"] == again["fencing_token"]
    repeat = http.post("/v1/submit", json=items[:2]).json()["results"]
    assert [r["outcome"] for r in repeat] == ["replayed", "replayed"]
    assert all(r["replayed"] for r in repeat)

    problem(http.post("/v1/submit", json=[]), 422, "invalid_request")
    problem(http.post("/v1/submit", json=[{"lease_token": "nonsense"}]), 400, "invalid_token")


def test_a_list_submit_answers_an_unknown_or_forged_item_alone(http: httpx.Client) -> None:
    for n in range(2):
        enqueue(http, "batch:mixed", {"n": n})
    leases = http.post("/v1/claim", json={"queue": "batch:mixed", "max_tasks": 2}).json()["tasks"]
    head, _, secret = leases[1]["lease_token"].rpartition("/")
    unknown = f"batch:mixed/999999997/{leases[0]['fencing_token']}/{secret}"
    forged = f"{head}/{'0' * 32}"
    items = [{"lease_token": token, "result": "r"} for token in (leases[0]["lease_token"], unknown, forged)]
    answer = http.post("/v1/submit", json=items)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [(r["task_id"], r["outcome"], r["state"]) for r in results] == [
        (leases[0]["task_id"], "accepted", "done"),
        ("t_999999997", "not_found", None),
        (leases[1]["task_id"], "invalid_token", None),
    ]
    assert task(http, leases[0]["task_id"])["result"] == "r", "the valid item was applied"
    assert task(http, leases[1]["task_id"])["state"] == "leased", "the forged one changed nothing"
