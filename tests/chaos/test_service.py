"""Faults at the HTTP door: bad keys of every kind, hostile bodies and a
schemathesis run (no 5xx, nothing written, bounded memory), and 500 event
streams on one key with frozen readers."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.chaos.battery import ROOT, Database, Service, report, run_threads
from tests.waiting import wait_for

pytestmark = pytest.mark.chaos

FAILURE_LIMIT = 100  # failed authentications per address in 60 s (batonq.access.FailedAuth)


def status(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"] if response.status_code >= 400 else ""


def test_bad_keys_of_every_kind(db: Database) -> None:
    """Scenario 9: every kind of bad key gets its documented refusal; no key
    text reaches the log; after 100 failures in a minute an address gets 429 with
    Retry-After, whatever key it sends."""
    service = Service(db)
    try:
        with httpx.Client(base_url=service.url, headers=service.headers(), timeout=10) as admin:
            made = [
                admin.post("/v1/keys", json=body).json()
                for body in (
                    {"ring": 3, "queues": ["shop:*"]},
                    {"ring": 2, "queues": ["shop:*"]},
                    {"ring": 2},
                )
            ]
            observer, shop_worker, revoked = (k["key"] for k in made)
            assert admin.delete(f"/v1/keys/{made[2]['id']}").status_code == 200
            admin_id = service.key.split("_")[1]
            wrong_secret = f"bq_{admin_id}_{'0' * 64}"
            unknown_id = f"bq_987654_{service.key.split('_')[2]}"
            enqueue = {"queue": "shop:orders", "payload": {"n": 1}}
            cases: list[tuple[str, dict[str, str], str, dict[str, Any] | None, tuple[int, str]]] = [
                ("no key", {}, "/v1/queues", None, (401, "unauthorized")),
                (
                    "basic auth",
                    {"Authorization": "Basic YWRtaW46YWRtaW4="},
                    "/v1/queues",
                    None,
                    (401, "unauthorized"),
                ),
                ("empty bearer", {"Authorization": "Bearer"}, "/v1/queues", None, (401, "unauthorized")),
                ("garbage", {"Authorization": "Bearer hunter2"}, "/v1/queues", None, (401, "unauthorized")),
                (
                    "unknown id",
                    {"Authorization": f"Bearer {unknown_id}"},
                    "/v1/queues",
                    None,
                    (401, "unauthorized"),
                ),
                (
                    "wrong secret",
                    {"Authorization": f"Bearer {wrong_secret}"},
                    "/v1/queues",
                    None,
                    (401, "unauthorized"),
                ),
                (
                    "revoked",
                    {"Authorization": f"Bearer {revoked}"},
                    "/v1/queues",
                    None,
                    (401, "unauthorized"),
                ),
                (
                    "ring too weak",
                    {"Authorization": f"Bearer {observer}"},
                    "/v1/enqueue",
                    enqueue,
                    (403, "forbidden"),
                ),
                (
                    "out of scope",
                    {"Authorization": f"Bearer {shop_worker}"},
                    "/v1/enqueue",
                    {"queue": "mail:out", "payload": 1},
                    (403, "forbidden"),
                ),
                (
                    "unknown task",
                    {"Authorization": f"Bearer {shop_worker}"},
                    "/v1/tasks/t_987654",
                    None,
                    (404, "task_not_found"),
                ),
            ]
            seen = {}
            with httpx.Client(base_url=service.url, timeout=10) as anon:
                for name, headers, path, body, expected in cases:
                    if body is None:
                        answer = anon.get(path, headers=headers)
                    else:
                        answer = anon.post(path, headers=headers, json=body)
                    seen[name] = status(answer)
                    assert seen[name] == expected, (name, answer.text)
                    if expected[0] == 401:
                        assert answer.headers["www-authenticate"] == "Bearer"
                # The limit: failures so far are 7 (the 401s); the rest reach it.
                for _ in range(FAILURE_LIMIT - 7):
                    assert anon.get("/v1/queues", headers={"Authorization": "Bearer nope"}).status_code == 401
                locked = anon.get("/v1/queues", headers=service.headers())
                assert status(locked) == (429, "too_many_failures")
                assert 1 <= int(locked.headers["retry-after"]) <= 60
                assert anon.get("/v1/queues", headers={"Authorization": "Bearer nope"}).status_code == 429
        # The admin key is printed once, by design, at first start; nothing after it may show a key.
        log = service.log.split("Make narrower keys", 1)[1]
    finally:
        service.stop()
    for secret in {
        k.split("_")[-1] for k in (observer, shop_worker, revoked, service.key, wrong_secret, unknown_id)
    }:
        assert secret not in log, "key text in the service's log"
    assert "hunter2" not in log and "YWRtaW46YWRtaW4=" not in log
    report("bad_keys", {"refusals": seen, "locked_after_failures": FAILURE_LIMIT, "log_bytes": len(log)})


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


HOSTILE: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("nested 300 deep", "/v1/enqueue", f'{{"queue": "h:q", "payload": {_deep(300)}}}'.encode(), {}),
    ("5,000-digit number", "/v1/enqueue", b'{"queue": "h:q", "payload": ' + b"9" * 5000 + b"}", {}),
    ("UTF-16 body", "/v1/enqueue", '{"queue": "h:q", "payload": 1}'.encode("utf-16"), {}),
    ("NUL in payload key", "/v1/enqueue", b'{"queue": "h:q", "payload": {"a\\u0000": 1}}', {}),
    ("NUL in queue", "/v1/enqueue", b'{"queue": "h:q\\u0000", "payload": 1}', {}),
    ("bad queue name", "/v1/enqueue", b'{"queue": "H Q", "payload": 1}', {}),
    ("not JSON", "/v1/enqueue", b'{"queue": ', {}),
    (
        "100,000 items",
        "/v1/enqueue",
        b"[" + b",".join([b'{"queue": "h:q", "payload": 1}'] * 100_000) + b"]",
        {},
    ),
    ("nested result", "/v1/submit", f'{{"lease_token": "x", "result": {_deep(300)}}}'.encode(), {}),
]


def test_hostile_bodies_and_schemathesis_find_no_5xx(db: Database, workdir: Path) -> None:
    """Scenario 8: hostile bodies are refused with a 4xx and write nothing;
    a schemathesis run (examples, fuzzing, stateful) against /openapi.json
    finds no server error; the server's memory grows by less than 50 MB."""
    service = Service(db)
    try:
        with httpx.Client(base_url=service.url, headers=service.headers(), timeout=30) as http:
            for _ in range(50):  # warm up
                http.get("/v1/queues")
            rss_before = service.rss_bytes()
            answers = {}
            for name, path, body, headers in HOSTILE:
                answer = http.post(
                    path, content=body, headers={"Content-Type": "application/json", **headers}
                )
                answers[name] = answer.status_code
            for name, value in (("huge Last-Event-ID", "9" * 5000), ("non-ASCII Last-Event-ID", "\xe9")):
                with http.stream(
                    "GET",
                    "/v1/stream",
                    params={"queue": "h:q"},
                    headers={"Last-Event-ID": value.encode("latin-1")},
                ) as answer:
                    answers[name] = answer.status_code
        written = (
            db.sql("SELECT count(*) FROM batonq.tasks")[0][0]
            + db.sql("SELECT count(*) FROM batonq.archive")[0][0]
        )
        schemathesis = _schemathesis(service, workdir)
        rss_after = service.rss_bytes()
    finally:
        service.stop()
    growth_mb = (rss_after - rss_before) / 2**20
    report(
        "hostile_bodies+schemathesis",
        {
            "answers": answers,
            "written_by_hostile_bodies": written,
            "rss_growth_mb": round(growth_mb, 1),
            "schemathesis": schemathesis,
        },
    )
    bad = {
        name: code for name, code in answers.items() if not 400 <= code < 500 and "Last-Event-ID" not in name
    }
    assert bad == {}, f"hostile bodies not refused with a 4xx: {bad}"
    # A Last-Event-ID the server cannot use may be refused or ignored, never a 5xx.
    assert answers["huge Last-Event-ID"] < 500 and answers["non-ASCII Last-Event-ID"] < 500
    assert written == 0
    assert schemathesis["server_errors"] == 0, schemathesis
    assert growth_mb < 50


def _schemathesis(service: Service, workdir: Path) -> dict[str, Any]:
    """A bounded schemathesis run, as the admin, through all its phases."""
    st = Path(sys.executable).with_name("st")
    command = [
        str(st),
        "run",
        f"{service.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {service.key}",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--exclude-path",
        "/v1/stream",
        "--exclude-path-regex",
        "^/v1/keys/",
        "--max-examples",
        os.environ.get("CHAOS_SCHEMATHESIS_EXAMPLES", "5"),
        "--checks",
        "not_a_server_error",
        "--workers",
        "1",
        "--seed",
        "20261203",
        "--generation-database",
        "none",
        "--request-timeout",
        "10",
        "--no-color",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    run = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=400)
    output = run.stdout + run.stderr
    (workdir / "schemathesis.log").write_text(output)
    tested = re.search(r"Tested: (\d+)", output)
    cases = re.search(r"(\d+) generated", output)
    return {
        "exit": run.returncode,
        "server_errors": output.count("Server error"),
        "run_s": round(time.monotonic() - started),
        "operations": int(tested[1]) if tested else None,
        "cases": int(cases[1]) if cases else None,
        "tail": output[-600:] if run.returncode else "",
    }


STREAMS = int(os.environ.get("CHAOS_STREAMS", "500"))
POOL = 20  # the service's pool size (batonq.service.app)


def _open_stream(service: Service, queue: str) -> tuple[socket.socket, int]:
    """A raw GET /v1/stream; returns the socket and the response status."""
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    sock.sendall(
        f"GET /v1/stream?queue={queue} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {service.key}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            return sock, 0
        head += chunk
    return sock, int(head.split()[1])


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def test_500_streams_on_one_key_with_frozen_readers(db: Database) -> None:
    """Scenario 10: 500 event streams on one key: past the per-key cap they get
    429; readers that stop reading are dropped by the server; once all are
    gone the server's file descriptors and database connections are back to
    their baseline."""
    service = Service(db, "--keepalive", "0.2")
    sockets: list[socket.socket] = []
    try:
        with httpx.Client(base_url=service.url, headers=service.headers(), timeout=30) as http:
            http.get("/v1/queues")
            fds, conns = service.fds(), _connections(db)
            opened: list[tuple[socket.socket, int]] = []
            run_threads(
                [lambda: opened.extend(_open_stream(service, "s:q") for _ in range(STREAMS // 10))] * 10
            )
            sockets += [sock for sock, _ in opened]
            statuses = dict(Counter(code for _, code in opened))
            figures: dict[str, Any] = {
                "streams": STREAMS,
                "statuses": statuses,
                "fds_before": fds,
                "fds_open": service.fds(),
                "db_connections_before": conns,
                "db_connections_open": _connections(db),
            }
            # Every open stream is a frozen reader from here on: events pile up unread.
            for _ in range(4):
                http.post("/v1/enqueue", json=[{"queue": "s:q", "payload": "x" * 1000}] * 500)
            figures["frozen_dropped"] = _within(
                30, lambda: sum(_closed_by_server(s) for s in sockets) or None
            )
        for sock in sockets:
            sock.close()
        # The service's pool may keep the connections it opened (20 at most,
        # plus its listener and sweeper), each with its fd: that is the baseline.
        _within(15, lambda: _connections(db) <= POOL + 2)
        figures["db_connections_after"] = _connections(db)
        pooled = figures["db_connections_after"] - conns
        _within(15, lambda: service.fds() <= fds + pooled + 2)
        figures["fds_after"] = service.fds()
    finally:
        for sock in sockets:
            sock.close()
        service.stop()
    report("sse_streams", figures)
    assert set(statuses) <= {200, 429} and statuses.get(429, 0) > 0, f"no per-key cap: {statuses}"
    assert figures["frozen_dropped"], "the server kept every frozen reader"
    assert figures["db_connections_after"] <= POOL + 2, "database connections are not back to baseline"
    assert figures["fds_after"] <= fds + pooled + 2, "the server's file descriptors are not back to baseline"


def _within(timeout: float, check: Any) -> Any:
    """``wait_for``, answering None instead of failing: the figures are reported first."""
    try:
        return wait_for(check, timeout=timeout)
    except AssertionError:
        return None


def _connections(db: Database) -> int:
    return int(db.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db.name,))[0][0]) - 1
