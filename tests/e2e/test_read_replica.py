"""``batonq serve --read-url``: listings, counts and the dashboard's pages
read from a real streaming replica; writes, claims and key checks on the
primary.

A private primary and a standby made from it with ``pg_basebackup -R``,
each on a free port. Pausing the standby's WAL replay freezes what it shows,
so a read that comes from it is told apart from one that comes from the
primary.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from tests.e2e.live import LiveServer, claim_one, enqueue
from tests.private_cluster import PrivateCluster, private_cluster, private_standby
from tests.waiting import wait_for

import batonq
from batonq.models import task_ref

QUEUE = "replica:q"


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[PrivateCluster, PrivateCluster]]:
    with private_cluster() as primary:
        batonq.migrate(primary.dsn)
        with private_standby(primary) as standby:
            yield primary, standby


@pytest.fixture(scope="module")
def admin_key(clusters: tuple[PrivateCluster, PrivateCluster]) -> str:
    with batonq.connect(clusters[0].dsn, listen=False) as client:
        return client.create_key(0, ["*"], "admin").key


@pytest.fixture
def replay(clusters: tuple[PrivateCluster, PrivateCluster]) -> Iterator[psycopg.Connection]:
    """A connection to the standby, its replay running again after the test."""
    with psycopg.connect(clusters[1].dsn, autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        yield conn
        conn.execute("SELECT pg_wal_replay_resume()")


def pause(replay: psycopg.Connection) -> None:
    replay.execute("SELECT pg_wal_replay_pause()")
    wait_for(lambda: replay.execute("SELECT pg_get_wal_replay_pause_state()").fetchone() == ("paused",),
             timeout=30, what="the standby's replay to pause")  # fmt: skip


def listed(http: httpx.Client) -> set[str]:
    response = http.get("/v1/tasks", params={"queue": QUEUE})
    assert response.status_code == 200, response.text
    return {t["task_id"] for t in response.json()["tasks"]}


def pending(http: httpx.Client) -> int:
    response = http.get("/v1/queues")
    assert response.status_code == 200, response.text
    counts: int = next(q["pending"] for q in response.json()["queues"] if q["queue"] == QUEUE)
    return counts


def metric_pending(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    found = re.search(rf'^batonq_tasks{{queue="{QUEUE}",state="pending"}} (\S+)$', text, re.M)
    assert found, text
    return float(found.group(1))


def test_listings_come_from_the_replica_and_work_from_the_primary(
    clusters: tuple[PrivateCluster, PrivateCluster], admin_key: str, replay: psycopg.Connection
) -> None:
    primary, standby = clusters
    server = LiveServer(primary.dsn, "--read-url", standby.dsn)
    try:
        with server.http(admin_key) as http, batonq.connect(primary.dsn, listen=False) as direct:
            first = enqueue(http, QUEUE, 1)
            wait_for(lambda: first in listed(http), timeout=30, what="the replica to show the first task")
            before = listed(http)
            pending_before = pending(http)

            pause(replay)
            second = enqueue(http, QUEUE, 2)  # writes go to the primary, replay paused or not
            # The primary has it; the listings, counts and metrics, read from the replica, do not yet.
            assert second in {task_ref(t.id) for t in direct.tasks(QUEUE)}
            assert listed(http) == before
            assert pending(http) == pending_before
            assert metric_pending(http) == pending_before
            # One task by id falls back to the primary when the replica has not seen it.
            response = http.get(f"/v1/tasks/{second}")
            assert response.status_code == 200, response.text
            assert response.json()["task_id"] == second
            assert http.get("/v1/tasks/t_999999999").status_code == 404

            # Claims and submits are on the primary: they work while the replica is frozen.
            claimed = claim_one(http, QUEUE, lease_s=60)
            done = http.post("/v1/submit", json={"lease_token": claimed["lease_token"], "result": "ok"})
            assert done.status_code == 200, done.text
            assert done.json()["state"] == "done"
            # A key made now signs in at once: key checks are on the primary.
            made = http.post("/v1/keys", json={"ring": 3, "queues": ["replica:*"], "name": "observer"})
            assert made.status_code == 201, made.text
            with server.http(made.json()["key"]) as observer:
                assert listed(observer) == before
            # The dashboard signs that key in too, and shows the queue; its task list is the replica's.
            with httpx.Client(base_url=server.url, timeout=30.0) as browser:
                form = browser.get("/ui/login")
                token = re.search(r'name="csrf" value="([^"]+)"', form.text)
                assert token, form.text
                signed = browser.post(
                    "/ui/login", data={"key": made.json()["key"], "csrf": token[1]}, follow_redirects=True
                )
                assert signed.status_code == 200, signed.text
                assert str(signed.url).endswith("/ui")
                assert QUEUE in signed.text
                shown = re.compile(rf"\b{second}\b")
                assert not shown.search(browser.get("/ui/tasks", params={"queue": QUEUE}).text)

                replay.execute("SELECT pg_wal_replay_resume()")
                wait_for(lambda: second in listed(http), timeout=30, what="the replica to show task 2")
                wait_for(lambda: pending(http) == direct.queues(QUEUE)[0].pending, timeout=30,
                         what="the replica's counts to catch up")  # fmt: skip
                assert shown.search(browser.get("/ui/tasks", params={"queue": QUEUE}).text)
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["no setting", "$BATONQ_READ_URL"])
def test_the_setting_decides_where_listings_are_read(
    clusters: tuple[PrivateCluster, PrivateCluster],
    admin_key: str,
    replay: psycopg.Connection,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    primary, standby = clusters
    if how == "$BATONQ_READ_URL":
        monkeypatch.setenv("BATONQ_READ_URL", standby.dsn)
    else:
        monkeypatch.delenv("BATONQ_READ_URL", raising=False)
    server = LiveServer(primary.dsn)
    try:
        with server.http(admin_key) as http:
            pause(replay)
            task_id = enqueue(http, QUEUE, how)
            # Without the setting every read is on the primary: the new task is listed at once.
            assert (task_id in listed(http)) is (how == "no setting")
    finally:
        server.stop()


def test_a_replica_that_goes_down_fails_its_reads_only(
    clusters: tuple[PrivateCluster, PrivateCluster], admin_key: str
) -> None:
    primary, standby = clusters
    server = LiveServer(primary.dsn, "--read-url", standby.dsn)
    try:
        with server.http(admin_key) as http:
            standby.stop()
            try:
                assert http.get("/v1/tasks", params={"queue": QUEUE}).status_code == 503
                task_id = enqueue(http, QUEUE, "while the replica is down")
                claim_one(http, QUEUE, lease_s=60)
            finally:
                standby.start()

            def back() -> bool:
                response = http.get("/v1/tasks", params={"queue": QUEUE})
                shown = response.json()["tasks"] if response.status_code == 200 else []
                return task_id in {t["task_id"] for t in shown}

            wait_for(back, timeout=30, what="reads from the replica again")
    finally:
        server.stop()
