"""Several ``batonq serve`` processes against one database are one service:
two servers, four HTTP workers each (batch claims and submits over keep-alive
connections), 2,000 tasks, each done exactly once."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
from tests.e2e.conftest import Serve
from tests.e2e.live import LiveServer, new_key

Q = "scale:jobs"
TASKS = 2_000
WORKERS_PER_SERVER = 4
BATCH = 10


def work(server: LiveServer, key: str, name: str, done: list[str], failures: list[str]) -> None:
    """Claim a batch, submit each task, until a claim comes back empty."""
    try:
        with server.http(key) as http:
            while True:
                claimed = http.post(
                    "/v1/claim", json={"queue": Q, "max_tasks": BATCH, "worker": name, "lease_s": 120}
                )
                assert claimed.status_code == 200, claimed.text
                tasks = claimed.json()["tasks"]
                if not tasks:
                    return
                for task in tasks:
                    result = {"n": task["row"]["n"], "by": name}
                    answer = http.post(
                        "/v1/submit", json={"lease_token": task["lease_token"], "result": result}
                    )
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["replayed"] is False
                    done.append(task["task_id"])
    except Exception as error:
        failures.append(f"{name}: {error!r}")


def test_two_servers_four_workers_each_do_2000_tasks_exactly_once(
    serve: Serve, sql: psycopg.Connection[Any]
) -> None:
    first = serve()
    second = serve()
    assert first.admin_key and second.admin_key is None, "the admin key is made once, by the first"
    with first.http(first.admin_key) as admin:
        for start in range(0, TASKS, 500):
            batch = [{"queue": Q, "payload": {"n": n}} for n in range(start, start + 500)]
            assert admin.post("/v1/enqueue", json=batch).status_code == 200
        _, key = new_key(admin, 2, ["scale:*"])

    done: dict[str, list[str]] = {}
    failures: list[str] = []
    threads = []
    for server_name, server in (("a", first), ("b", second)):
        for i in range(WORKERS_PER_SERVER):
            name = f"{server_name}{i}"
            done[name] = []
            threads.append(threading.Thread(target=work, args=(server, key, name, done[name], failures)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a worker did not finish"
    assert not failures, failures

    handed = Counter(task_id for mine in done.values() for task_id in mine)
    assert len(handed) == TASKS and set(handed.values()) == {1}, handed.most_common(3)
    by_server = {s: sum(len(m) for n, m in done.items() if n.startswith(s)) for s in "ab"}
    assert all(by_server.values()), f"both servers served: {by_server}"

    archive = sql.execute(
        "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE state = 'done' AND attempts = 1"
        " AND (result->>'n')::int = (payload->>'n')::int) FROM batonq.archive WHERE queue = %s",
        [Q],
    ).fetchone()
    assert archive == (TASKS, TASKS, TASKS)
    assert sql.execute("SELECT count(*) FROM batonq.tasks WHERE queue = %s", [Q]).fetchone() == (0,)
    ledger = sql.execute("SELECT count(*) FROM batonq.submits WHERE queue = %s", [Q])
    assert ledger.fetchone() == (0,), "no refused or replayed submits"
