"""Bad input over HTTP gets a specific error and loses nothing: bodies over
the limit are refused with 413 before they are parsed, payloads over 128 KiB
with 413 payload_too_large, a bad queue name with 400, an unknown task with
404, a body that does not match the schema with 422; every error has the
shape ``{"error": {"code", "message"}}``."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from tests.e2e.live import LiveServer, claim_one, enqueue, problem

MiB = 1024 * 1024


def test_a_body_over_the_limit_is_refused_with_413(shared_http: httpx.Client) -> None:
    big = b'{"queue": "limits", "payload": "' + b"x" * (9 * MiB) + b'"}'
    error = problem(shared_http.post("/v1/enqueue", content=big), 413, "request_too_large")
    assert "8388608" in error["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        for start in range(0, len(big), MiB):
            yield big[start : start + MiB]

    problem(shared_http.post("/v1/enqueue", content=chunks()), 413, "request_too_large")
    # The connection is still good, and nothing was enqueued.
    assert shared_http.get("/v1/tasks", params={"queue": "limits"}).json()["tasks"] == []


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(
    shared_server: LiveServer,
) -> None:
    """The server answers a 9 MiB Content-Length at once, without waiting for
    (or reading) a byte of the body."""
    request = (
        "POST /v1/enqueue HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {shared_server.admin_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {9 * MiB}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", shared_server.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(request.encode())
        head, body = _read_response(sock)
        took = time.monotonic() - started
    assert head.startswith("HTTP/1.1 413 "), head
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert took < 2, took


def _read_response(sock: socket.socket) -> tuple[str, bytes]:
    """One HTTP response's head and body (the body by its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or b"EOF"
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-body"
        body += chunk
    return head.decode(), body


def test_a_small_max_body_bytes(serve: object) -> None:
    from tests.e2e.conftest import Serve

    assert callable(serve)
    server = serve("--max-body-bytes", "2048")
    assert isinstance(server, LiveServer) and Serve
    with server.http(server.admin_key) as http:
        assert http.post("/v1/enqueue", json={"queue": "small", "payload": "x" * 1500}).status_code == 200
        problem(
            http.post("/v1/enqueue", json={"queue": "small", "payload": "x" * 2100}), 413, "request_too_large"
        )


def test_a_payload_over_128_kib_is_refused_and_nothing_is_lost(shared_http: httpx.Client) -> None:
    payload = "x" * (128 * 1024 + 1)
    error = problem(
        shared_http.post("/v1/enqueue", json={"queue": "big", "payload": payload}), 413, "payload_too_large"
    )
    assert (error["what"], error["limit"]) == ("payload", 131072)
    assert error["size"] > 131072
    batch = [{"queue": "big", "payload": 1, "idempotency_key": "fine"}, {"queue": "big", "payload": payload}]
    problem(shared_http.post("/v1/enqueue", json=batch), 413, "payload_too_large")
    assert shared_http.get("/v1/tasks", params={"queue": "big"}).json()["tasks"] == [], (
        "all of a list or none"
    )

    # A result over the limit: refused, and the lease still holds for a good one.
    task_id = enqueue(shared_http, "big", {"n": 1})
    lease = claim_one(shared_http, "big", lease_s=60)
    too_big = shared_http.post("/v1/submit", json={"lease_token": lease["lease_token"], "result": payload})
    assert problem(too_big, 413, "payload_too_large")["what"] == "result"
    assert shared_http.get(f"/v1/tasks/{task_id}").json()["state"] == "leased"
    fine = shared_http.post("/v1/submit", json={"lease_token": lease["lease_token"], "result": "ok"})
    assert fine.status_code == 200 and fine.json()["state"] == "done"


def test_what_could_not_be_served_is_refused_at_the_door(shared_http: httpx.Client) -> None:
    """A payload or result nested past 64 levels would be stored but could
    not be read back (serialisers stop at 255); it is refused with 400: by
    the engine, which names the field, or, deeper than a body may nest at
    all, by the body parser."""
    deep = json.loads("[" * 65 + "]" * 65)
    refused = shared_http.post("/v1/enqueue", json={"queue": "deep", "payload": deep})
    error = problem(refused, 400, "json_too_deep")
    assert error["message"] == "payload nests 65 levels deep; the limit is 64"
    assert (error["depth"], error["limit"]) == (65, 64)
    deeper = {"queue": "deep", "payload": json.loads("[" * 300 + "]" * 300)}
    error = problem(shared_http.post("/v1/enqueue", json=deeper), 400, "invalid_json")
    assert error["message"] == "the body is not valid JSON: it nests deeper than 66 levels"
    for n in range(10):
        enqueue(shared_http, "deep", {"n": n})
    leases = shared_http.post("/v1/claim", json={"queue": "deep", "max_tasks": 10}).json()["tasks"]
    for lease in leases:
        submit = shared_http.post("/v1/submit", json={"lease_token": lease["lease_token"], "result": deep})
        assert problem(submit, 400, "json_too_deep")["what"] == "result"
    listed = shared_http.get("/v1/tasks", params={"queue": "deep"})
    assert listed.status_code == 200 and [t["state"] for t in listed.json()["tasks"]] == ["leased"] * 10


def test_rows_stored_before_the_limits_are_still_served(
    http: httpx.Client, sql: psycopg.Connection[Any]
) -> None:
    """Rows an older engine accepted (a 5,000-digit number, 300 levels) are
    listed, shown and claimed: no read fails, and no claim fails after its
    lease was taken."""
    huge, deep = "9" * 5000, "[" * 300 + "]" * 300
    ids = [enqueue(http, "legacy", n) for n in range(2)]
    sql.execute("UPDATE batonq.tasks SET payload = %s::jsonb WHERE id = %s", (f"[{huge}]", int(ids[0][2:])))
    sql.execute("UPDATE batonq.tasks SET payload = %s::jsonb WHERE id = %s", (deep, int(ids[1][2:])))
    listed = http.get("/v1/tasks", params={"queue": "legacy"})
    assert listed.status_code == 200, listed.text
    assert http.get(f"/v1/tasks/{ids[0]}").status_code == 200
    claimed = http.post("/v1/claim", json={"queue": "legacy", "max_tasks": 10})
    assert claimed.status_code == 200, claimed.text
    payloads = {t["task_id"]: t["row"] for t in claimed.json()["tasks"]}
    # The number comes as its digits (a string); the deep value as its JSON text.
    assert payloads == {ids[0]: [huge], ids[1]: deep}


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("POST", "/v1/enqueue", {"queue": "Bad Name", "payload": 1}),
        (
            "POST",
            "/v1/enqueue",
            [{"queue": "ok", "payload": 1}, {"queue": "-starts-with-dash", "payload": 1}],
        ),
        ("POST", "/v1/claim", {"queue": "UPPER"}),
        ("GET", "/v1/tasks?queue=sp%20ace", None),
        ("GET", "/v1/stream?queue=" + "x" * 129, None),
        ("PATCH", "/v1/queues/Bad", {"lease_s": 10}),
        ("POST", "/v1/graph/edges", {"from_queue": "ok", "to_queue": "n/a"}),
    ],
)
def test_a_bad_queue_name_is_400(shared_http: httpx.Client, method: str, path: str, body: object) -> None:
    response = shared_http.request(method, path, json=body)
    error = problem(response, 400, "invalid_queue_name")
    assert "a-z 0-9" in error["message"]


def test_an_unknown_task_is_404(shared_http: httpx.Client) -> None:
    error = problem(shared_http.get("/v1/tasks/t_987654321"), 404, "task_not_found")
    assert error["task_id"] == "t_987654321"
    problem(shared_http.get("/v1/tasks/987654321"), 404, "task_not_found")
    problem(shared_http.post("/v1/tasks/t_987654321/cancel"), 404, "task_not_found")
    problem(shared_http.get("/v1/runs/t_987654321"), 404, "task_not_found")
    problem(shared_http.post("/v1/enqueue", json={"queue": "q", "payload": 1, "parent": "t_987654321"}),
            404, "task_not_found")  # fmt: skip
    problem(shared_http.delete("/v1/keys/987654321"), 404, "key_not_found")
    problem(shared_http.delete("/v1/graph/edges/nowhere/nothing"), 404, "edge_not_found")
    problem(shared_http.get("/v1/no-such-thing"), 404, "not_found")


@pytest.mark.parametrize(
    "path, body, where",
    [
        ("/v1/claim", {"queue": "q", "max_tasks": 0}, "max_tasks"),
        ("/v1/claim", {"queue": "q", "wait_s": 56}, "wait_s"),
        ("/v1/claim", {"queue": "q", "lease_s": "60"}, "lease_s"),
        ("/v1/claim", {"queue": "q", "surprise": 1}, "surprise"),
        ("/v1/claim", {}, "queue"),
        ("/v1/enqueue", {"queue": "q"}, "payload"),
        ("/v1/enqueue", {"queue": "q", "payload": 1, "held": "yes"}, "held"),
        ("/v1/submit", {"lease_token": 7, "result": 1}, "lease_token"),
        ("/v1/fail", {"lease_token": "t", "requeue": 0}, "requeue"),
        ("/v1/keys", {"ring": 4}, "ring"),
    ],
)
def test_a_body_that_does_not_match_the_schema_is_422(
    shared_http: httpx.Client, path: str, body: object, where: str
) -> None:
    error = problem(shared_http.post(path, json=body), 422, "invalid_request")
    assert error["message"].startswith(f"{where}: ") or error["message"].startswith(f"{where} must be"), error
    assert [p["at"] for p in error["problems"]] == [where]


def test_malformed_requests_are_400_with_a_code_of_their_own(shared_http: httpx.Client) -> None:
    problem(shared_http.post("/v1/claim", content=b'{"queue": '), 400, "invalid_json")
    problem(shared_http.post("/v1/claim", content=b"\xff\xfe not utf-8"), 400, "invalid_json")
    problem(
        shared_http.post("/v1/submit", json={"lease_token": "made-up", "result": 1}), 400, "invalid_token"
    )
    problem(shared_http.get("/v1/tasks/not-an-id"), 422, "invalid_request")
    # Values PostgreSQL cannot store are refused as such, not as a server error.
    problem(
        shared_http.post("/v1/enqueue", json={"queue": "q", "payload": "\u0000"}), 400, "invalid_argument"
    )
    problem(shared_http.post("/v1/keys", json={"ring": 3, "name": "nul\u0000"}), 400, "invalid_argument")
    problem(
        shared_http.post("/v1/claim", content=b'{"queue": "q", "worker": "\\ud800"}'), 422, "invalid_request"
    )
    problem(
        shared_http.post("/v1/enqueue", content=b'{"queue": "q", "payload": "\\ud800"}'),
        400,
        "invalid_argument",
    )


def test_a_body_that_is_not_utf8_json_is_400_saying_what_is_wrong(shared_http: httpx.Client) -> None:
    utf16 = json.dumps({"queue": "body:q", "payload": 1}).encode("utf-16-le")
    error = problem(shared_http.post("/v1/enqueue", content=utf16), 400, "invalid_json")
    assert "not UTF-8" in error["message"], error
    error = problem(shared_http.post("/v1/enqueue", content=b"\xff\xfe{}"), 400, "invalid_json")
    assert error["message"] == "the body is not valid JSON: it is not UTF-8 (byte 0 is 0xff)"

    deep = b'{"queue": "body:q", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    error = problem(shared_http.post("/v1/enqueue", content=deep), 400, "invalid_json")
    assert error["message"] == "the body is not valid JSON: it nests deeper than 66 levels"
    deep = b'{"queue": "body:q", "payload": ' + b"[" * 100 + b"]" * 100 + b"}"
    error = problem(shared_http.post("/v1/enqueue", content=deep), 400, "invalid_json")
    assert error["message"] == "the body is not valid JSON: it nests deeper than 66 levels"

    for number in (b"9" * 5000, b"-" + b"1" * 301, b"1" * 301 + b".5", b"1" * 301 + b"e2"):
        body = b'{"queue": "body:q", "payload": {"n": ' + number + b"}}"
        error = problem(shared_http.post("/v1/enqueue", content=body), 400, "invalid_json")
        assert error["message"] == "the body is not valid JSON: a number has more than 300 digits", number

    # What is refused above is refused for what it is, not for long digits or depth as such.
    long_string = {"queue": "body:q", "payload": {"digits": "7" * 5000, "n": 10**299, "x": 1.5}}
    assert shared_http.post("/v1/enqueue", json=long_string).status_code == 200
    nested: object = 1
    for _ in range(64):
        nested = [nested]
    response = shared_http.post("/v1/enqueue", json=[{"queue": "body:q", "payload": nested}])
    assert response.status_code == 200, response.text
    stored = shared_http.get("/v1/tasks", params={"queue": "body:q"}).json()["tasks"]
    assert [t["payload"] for t in stored] == [nested, long_string["payload"]]


def test_a_wrong_method_names_every_allowed_one(shared_http: httpx.Client) -> None:
    response = shared_http.put("/v1/keys")
    problem(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, POST"


def test_the_operator_actions_refuse_the_wrong_state(shared_http: httpx.Client) -> None:
    task_id = enqueue(shared_http, "states", 1)
    error = problem(shared_http.post(f"/v1/tasks/{task_id}/release"), 409, "invalid_state")
    assert "pending" in error["message"]


def test_an_infinite_number_is_number_too_large(shared_http: httpx.Client) -> None:
    """1e5000 parses as infinity, which JSON cannot write back: refused as
    a number of 1e300 or more, as the error table says."""
    body = b'{"queue": "infinite", "payload": {"n": 1e5000}}'
    sent = shared_http.post("/v1/enqueue", content=body, headers={"Content-Type": "application/json"})
    error = problem(sent, 400, "number_too_large")
    assert "infinite number" in error["message"] and error["limit"] == 300
    assert shared_http.get("/v1/tasks", params={"queue": "infinite"}).json()["tasks"] == []
