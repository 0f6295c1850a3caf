"""Three ``batonq serve`` processes behind nginx (deploy/nginx.conf) are one
service: twelve HTTP workers do 3,000 tasks (10,000 with
BATONQ_TEST_SCALE_TASKS=10000), each exactly once, while one
process is SIGKILLed midway; event-stream subscribers whose node died
reconnect through the proxy and keep receiving."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from typing import Any

import httpx
import psycopg
import pytest
from tests.deployed import nginx
from tests.e2e.conftest import Serve
from tests.e2e.live import new_key
from tests.waiting import wait_for

from batonq.sweeper import APPLICATION_NAME

Q = "scale:jobs"
EVENTS = "scale:events"
# 3,000 in the suite; BATONQ_TEST_SCALE_TASKS=10000 for the full size.
TASKS = int(os.environ.get("BATONQ_TEST_SCALE_TASKS", "3000"))
WORKERS = 12
BATCH = 10
LEASE_S = 5  # a claim whose reply died with its node: the task comes back this soon
KILL_AT = TASKS // 2


class Worker(threading.Thread):
    """Claims a batch and submits each task through the proxy until the
    queue is empty; retries a request the proxy could not place."""

    def __init__(self, url: str, key: str, name: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.name, self.stop = url, key, name, stop
        self.done: list[str] = []  # task ids whose submit was accepted
        self.replayed = 0
        self.retries = 0
        self.lost = 0
        self.failure: str | None = None

    def post(self, http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The reply, or None when the lease is no longer held (the task comes back)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = http.post(path, json=body)
                if answer.status_code == 200:
                    return answer.json()  # type: ignore[no-any-return]
                if answer.status_code == 409:
                    self.lost += 1
                    return None
                assert answer.status_code in (502, 503, 504), answer.text
            except httpx.TransportError:
                pass
            self.retries += 1
            assert time.monotonic() < deadline, f"{path} not answered within 30 s"

    def run(self) -> None:
        try:
            headers = {"Authorization": f"Bearer {self.key}"}
            with httpx.Client(base_url=self.url, headers=headers, timeout=30) as http:
                while not self.stop.is_set():
                    claim = {"queue": Q, "max_tasks": BATCH, "worker": self.name, "lease_s": LEASE_S}
                    claimed = self.post(http, "/v1/claim", claim)
                    tasks = claimed["tasks"] if claimed else []
                    if not tasks:
                        self.stop.wait(0.05)  # leases of a lost claim reply are still running out
                        continue
                    for task in tasks:
                        result = {"n": task["row"]["n"], "by": self.name}
                        answer = self.post(
                            http, "/v1/submit", {"lease_token": task["lease_token"], "result": result}
                        )
                        if answer is None:
                            continue
                        self.done.append(task["task_id"])
                        # replayed: the proxy sent it again after its node committed it and died
                        self.replayed += answer["replayed"]
        except BaseException as error:
            self.failure = f"{self.name}: {error!r}"


class Follower(threading.Thread):
    """Reads /v1/stream?queue=EVENTS through the proxy, reconnecting whenever
    the stream ends; notes which node served each connection."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.upstreams: list[str] = []
        self.available: list[float] = []  # time.monotonic() of each `available` event
        self.stop = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(10, read=60)) as http:
            while not self.stop.is_set():
                try:
                    with http.stream("GET", f"/v1/stream?queue={EVENTS}") as stream:
                        if stream.status_code == 200:
                            self.upstreams.append(stream.headers["x-batonq-upstream"])
                            for line in stream.iter_lines():
                                if line == "event: available":
                                    self.available.append(time.monotonic())
                                if self.stop.is_set():
                                    return
                except httpx.TransportError:
                    pass
                self.stop.wait(0.2)


@pytest.mark.timeout(900)
def test_three_servers_behind_nginx_do_10000_tasks_once_through_a_sigkill(
    serve: Serve, sql: psycopg.Connection[Any]
) -> None:
    servers = [serve() for _ in range(3)]
    admin_key = servers[0].admin_key
    assert admin_key
    auth = {"Authorization": f"Bearer {admin_key}"}
    with (
        nginx([s.port for s in servers]) as url,
        httpx.Client(base_url=url, headers=auth, timeout=30) as admin,
    ):
        for start in range(0, TASKS, 1000):
            batch = [{"queue": Q, "payload": {"n": n}} for n in range(start, start + 1000)]
            assert admin.post("/v1/enqueue", json=batch).status_code == 200
        _, key = new_key(admin, 2, ["scale:*"])

        followers = [Follower(url, key) for _ in range(3)]
        for follower in followers:
            follower.start()
        wait_for(lambda: all(f.upstreams for f in followers), timeout=15, what="the streams to open")

        stop = threading.Event()
        workers = [Worker(url, key, f"w{i}", stop) for i in range(WORKERS)]
        for worker in workers:
            worker.start()
        done = lambda: sum(len(w.done) for w in workers)  # noqa: E731

        failed = lambda: [w.failure for w in workers if w.failure]  # noqa: E731
        wait_for(lambda: done() >= KILL_AT or failed(), timeout=300, what=f"{KILL_AT} tasks done")
        assert failed() == []
        victim = servers[1]
        victim.proc.kill()  # SIGKILL: mid-request, with leases and open streams
        killed_at = time.monotonic()
        victim_address = f"127.0.0.1:{victim.port}"

        wait_for(lambda: done() >= TASKS or failed(), timeout=300, what=f"{TASKS} tasks done")
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
        assert failed() == []

        def all_received_since_kill() -> bool:
            admin.post("/v1/enqueue", json={"queue": EVENTS, "payload": {}})
            return all(f.available and f.available[-1] > killed_at for f in followers)

        wait_for(
            all_received_since_kill, timeout=30, every=0.5, what="every stream to receive after the kill"
        )
        for follower in followers:
            follower.stop.set()  # seen at the next event or keep-alive comment
        for follower in followers:
            follower.join(timeout=30)

    handed = Counter(task_id for w in workers for task_id in w.done)
    assert len(handed) == TASKS and set(handed.values()) == {1}, handed.most_common(3)
    archive = sql.execute(
        "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE state = 'done'"
        " AND (result->>'n')::int = (payload->>'n')::int) FROM batonq.archive WHERE queue = %s",
        [Q],
    ).fetchone()
    assert archive == (TASKS, TASKS, TASKS)
    assert sql.execute("SELECT count(*) FROM batonq.tasks WHERE queue = %s", [Q]).fetchone() == (0,)
    on_victim = [f for f in followers if f.upstreams[0] == victim_address]
    assert on_victim, "a stream was on the killed node"
    assert all(len(f.upstreams) >= 2 and f.upstreams[-1] != victim_address for f in on_victim)


IDLE_CLIENTS = 1_000
POOL = 10
IDLE_Q = "scale:idle"


@pytest.mark.timeout(900)
async def test_a_thousand_idle_long_polls_hold_a_handful_of_connections(
    serve: Serve, sql: psycopg.Connection[Any]
) -> None:
    """Long-polls wait on the process's one LISTEN connection and take a
    pooled connection only for each look: 1,000 of them waiting cost the
    pool's bound plus the LISTEN and sweeper connections."""
    # One key holds every long-poll here: lift its cap on open long-polls.
    server = serve("--max-connections", str(POOL), "--max-streams-per-key", str(2 * IDLE_CLIENTS))
    assert server.admin_key
    headers = {"Authorization": f"Bearer {server.admin_key}"}
    limits = httpx.Limits(max_connections=IDLE_CLIENTS + 10, max_keepalive_connections=IDLE_CLIENTS + 10)
    # Each waiter looks again every second (the service's poll interval), so
    # 1,000 of them keep the pool busy: replies may take a while on a loaded machine.
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=300, limits=limits) as http:
        assert (
            await http.post("/v1/enqueue", json={"queue": IDLE_Q, "payload": "make the queue"})
        ).status_code == 200
        first = await http.post("/v1/claim", json={"queue": IDLE_Q, "lease_s": 3600})
        assert first.json()["task_id"] is not None

        async def wait_for_one() -> list[dict[str, Any]]:
            answer = await http.post("/v1/claim", json={"queue": IDLE_Q, "wait_s": 45, "lease_s": 600})
            assert answer.status_code == 200, answer.text
            task: dict[str, Any] = answer.json()
            return [task] if task["task_id"] is not None else []

        waiters = [asyncio.create_task(wait_for_one()) for _ in range(IDLE_CLIENTS)]

        def connections() -> int:
            row = sql.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            assert row is not None
            return int(row[0])

        def in_flight() -> int:
            return sum(not w.done() for w in waiters)

        # Every request is in the server once the server has looked for each:
        # wait until the requests have all been sent and none has returned.
        deadline = time.monotonic() + 30
        most = 0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            most = max(most, connections())
            assert in_flight() == IDLE_CLIENTS, "a long-poll returned early"
        assert most <= POOL + 2, f"{most} connections for {IDLE_CLIENTS} waiting long-polls"

        batch = [{"queue": IDLE_Q, "payload": {"n": n}} for n in range(IDLE_CLIENTS)]
        assert (await http.post("/v1/enqueue", json=batch)).status_code == 200
        got = await asyncio.wait_for(asyncio.gather(*waiters), timeout=300)
    assert sorted(len(tasks) for tasks in got) == [1] * IDLE_CLIENTS
    assert connections() <= POOL + 2


def test_serve_workers_runs_that_many_processes_on_one_port(
    serve: Serve, sql: psycopg.Connection[Any]
) -> None:
    server = serve("--workers", "2")
    assert server.admin_key
    with server.http(server.admin_key) as http:
        for n in range(20):  # new connections, spread over the processes by the kernel
            with server.http(server.admin_key) as once:
                assert (
                    once.post("/v1/enqueue", json={"queue": "scale:w", "payload": {"n": n}}).status_code
                    == 200
                )
        assert len(http.post("/v1/claim", json={"queue": "scale:w", "max_tasks": 20}).json()["tasks"]) == 20

    def sweepers() -> int:
        # One sweeper per process: one leads, the other stands by.
        row = sql.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = %s",
            (APPLICATION_NAME,),
        ).fetchone()
        return int(row[0]) if row else 0

    wait_for(lambda: sweepers() == 2, timeout=60, what="a sweeper in each of the two processes")
