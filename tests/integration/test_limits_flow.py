"""Concurrency and rate limits under real concurrent claimers: threads with
connections of their own, long-polling, sampled from outside."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tests.waiting import wait_for

import batonq

Q = "limits:flow"

LEASED_SQL = "SELECT count(*) FROM batonq.tasks WHERE queue = %s AND state = 'leased'"
MOST_LEASED_PER_GROUP_SQL = """
    SELECT coalesce(max(n), 0) FROM (
        SELECT count(*) AS n FROM batonq.tasks
         WHERE queue = %s AND state = 'leased' AND group_key IS NOT NULL
         GROUP BY group_key) g"""
DONE_SQL = "SELECT count(*) FROM batonq.archive WHERE queue = %s AND state = 'done'"


class Sampler:
    """Runs ``query`` (one number) every few milliseconds on a connection of
    its own until stopped; keeps every answer."""

    def __init__(self, dsn: str, query: str) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(dsn, query), daemon=True)
        self._thread.start()

    def _run(self, dsn: str, query: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(query, (Q,)).fetchone()
                assert row is not None
                self.samples.append(int(row[0]))
                time.sleep(0.002)  # a sample every few ms, leaving the CPU to the claims

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples


class Workers:
    """``n`` threads, each with its own client, claiming from Q with
    long-polls and completing what they got after ``work_s``, until stopped.
    ``claimed_at`` holds when each claim returned (time.monotonic()), and
    ``groups`` each claimed task's group, in the same order."""

    def __init__(self, dsn: str, n: int, work_s: float, wait_s: float = 1.0) -> None:
        self.claimed_at: list[float] = []
        self.groups: list[str | None] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(dsn, work_s, wait_s), daemon=True) for _ in range(n)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, dsn: str, work_s: float, wait_s: float) -> None:
        try:
            with batonq.connect(dsn, max_connections=2) as client:
                while not self._stop.is_set():
                    for lease in client.claim(Q, wait_s=wait_s):
                        with self._lock:
                            self.claimed_at.append(time.monotonic())
                            self.groups.append(lease.group)
                        time.sleep(work_s)  # the job
                        client.complete(lease.lease_token, {"ok": True})
        except BaseException as error:  # reported by stop()
            self.errors.append(error)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        assert not self.errors, self.errors
        assert not any(thread.is_alive() for thread in self._threads)


@pytest.fixture
def count(sql: psycopg.Connection[Any]) -> Callable[[str], int]:
    def run(query: str) -> int:
        row = sql.execute(query, (Q,)).fetchone()
        assert row is not None
        return int(row[0])

    return run


def test_sixteen_workers_never_lease_more_than_the_queues_limit(
    admin: batonq.Client, dsn: str, admin_dsn: str, count: Callable[[str], int]
) -> None:
    tasks, limit, work_s = 90, 3, 0.05
    admin.configure_queue(Q, max_leased=limit)
    admin.enqueue_many(Q, [{"i": i} for i in range(tasks)])
    sampler = Sampler(admin_dsn, LEASED_SQL)
    workers = Workers(dsn, 16, work_s)
    try:
        wait_for(lambda: count(DONE_SQL) == tasks, timeout=60, what="every task done", every=0.01)
        elapsed = time.monotonic() - min(workers.claimed_at)
    finally:
        workers.stop()
        samples = sampler.stop()
    assert len(samples) > 100
    assert max(samples) == limit  # reached, never passed
    # The limit's capacity is limit / work_s tasks a second: the claims keep
    # up with it (0.77 of it measured on the loaded 2-core machine; a margin
    # for a busier one).
    capacity_s = tasks * work_s / limit
    assert capacity_s <= elapsed < 2.5 * capacity_s + 0.5, elapsed


def test_a_busy_group_neither_exceeds_its_limit_nor_holds_the_others_back(
    admin: batonq.Client, dsn: str, admin_dsn: str, sql: psycopg.Connection[Any], count: Callable[[str], int]
) -> None:
    """Per-group limit 1 over 50 groups, one of them with most of the tasks,
    enqueued first: the other groups' tasks are claimed past its backlog."""
    hot, others, per_other = 120, 49, 3
    admin.configure_queue(Q, group_max_leased=1)
    admin.enqueue_many(Q, [{"hot": i} for i in range(hot)], group="customer-hot")
    payloads = [{"group": g, "i": i} for g in range(others) for i in range(per_other)]
    admin.enqueue_many(Q, payloads, groups=[f"customer-{p['group']}" for p in payloads])
    total = hot + others * per_other
    sampler = Sampler(admin_dsn, MOST_LEASED_PER_GROUP_SQL)
    workers = Workers(dsn, 8, 0.01)
    try:
        wait_for(lambda: count(DONE_SQL) == total, timeout=90, what="every task done")
    finally:
        workers.stop()
        samples = sampler.stop()
    assert len(samples) > 100
    assert max(samples) == 1
    # When the last task of the other groups finished, the busy group still
    # had most of its backlog left.
    row = sql.execute(
        """SELECT count(*) FILTER (WHERE a.finished_at > o.last) FROM batonq.archive a,
                  (SELECT max(finished_at) AS last FROM batonq.archive
                    WHERE queue = %(q)s AND group_key <> 'customer-hot') o
            WHERE a.queue = %(q)s AND a.group_key = 'customer-hot'""",
        {"q": Q},
    ).fetchone()
    assert row is not None
    assert row[0] >= hot // 2, f"only {row[0]} of the busy group's {hot} tasks were left"


def test_a_rate_limit_of_20_a_second_gives_200_claims_in_10_s_without_bursts(
    admin: batonq.Client, dsn: str
) -> None:
    rate, seconds, bucket = 20, 10.0, 20
    admin.configure_queue(Q, rate_limit=rate, rate_period_s=1)
    admin.enqueue_many(Q, [{"i": i} for i in range(2 * rate * int(seconds))])
    started = time.monotonic()
    workers = Workers(dsn, 8, 0.0)
    try:
        time.sleep(seconds)  # the measured period itself
        claimed = sorted(t - started for t in workers.claimed_at if t - started <= seconds)
    finally:
        workers.stop()
    assert rate * seconds - 20 <= len(claimed) <= rate * seconds + 20, len(claimed)
    # No window holds more than the bucket plus what refilled during it
    # (one claim of slack for the clients' own clocks).
    for window in (0.1, 0.5, 1.0, 3.0):
        most = _most_in_a_window(claimed, window)
        assert most <= bucket + rate * window + 1, (window, most)


def _most_in_a_window(claimed: list[float], window: float) -> int:
    return max(sum(1 for t in claimed[i:] if t - start <= window) for i, start in enumerate(claimed))


def test_a_group_rate_limit_holds_each_group_to_its_bucket_and_starves_none(
    admin: batonq.Client, dsn: str
) -> None:
    """10 claims a second per group, 8 workers for 4 s: a busy group enqueued
    first takes its tokens and no more, and a light one gets its own."""
    rate, seconds = 10, 4.0
    admin.configure_queue(Q, group_rate_limit=rate, rate_period_s=1)
    admin.enqueue_many(Q, [{"hot": i} for i in range(200)], group="customer-hot")
    admin.enqueue_many(Q, [{"light": i} for i in range(100)], group="customer-light")
    started = time.monotonic()
    workers = Workers(dsn, 8, 0.0)
    try:
        time.sleep(seconds)  # the measured period itself
        claims = list(zip(workers.claimed_at, workers.groups, strict=True))
    finally:
        workers.stop()
    for group in ("customer-hot", "customer-light"):
        claimed = sorted(t - started for t, g in claims if g == group and t - started <= seconds)
        # The full bucket, then 10 a second (a few claims of slack for the
        # clients' own clocks and a loaded machine).
        assert rate * seconds - 10 <= len(claimed) <= rate + rate * seconds + 1, (group, len(claimed))
        for window in (0.1, 0.5, 1.0, 3.0):
            most = _most_in_a_window(claimed, window)
            assert most <= rate + rate * window + 1, (group, window, most)


@pytest.fixture
def waiter_dsn(dsn: str) -> str:
    return make_conninfo(dsn, application_name="limits-waiter")


def _waiting_since(sql: psycopg.Connection[Any], dsn: str, since: datetime) -> bool:
    """The waiter's last look (a claim) ended and it sleeps."""
    row = sql.execute(
        """SELECT count(*) FROM pg_stat_activity
            WHERE datname = %s AND application_name = 'limits-waiter' AND state = 'idle'
              AND query LIKE '%%batonq.claim(%%' AND query_start >= %s""",
        (conninfo_to_dict(dsn)["dbname"], since),
    ).fetchone()
    return row is not None and row[0] >= 1


@pytest.fixture
def long_poll(waiter_dsn: str) -> Iterator[Callable[[float], tuple[threading.Thread, list[Any]]]]:
    """Starts ``claim(Q, wait_s=...)`` in a thread on a client that polls
    only every 30 s, so that it returns sooner only when woken; its answer
    and when it came land in the list."""
    clients: list[batonq.Client] = []

    def start(wait_s: float) -> tuple[threading.Thread, list[Any]]:
        client = batonq.connect(waiter_dsn, poll_interval_s=30)
        clients.append(client)
        answer: list[Any] = []

        def run() -> None:
            answer.append(client.claim(Q, wait_s=wait_s))
            answer.append(time.monotonic())

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread, answer

    yield start
    for client in clients:
        client.close()


def _now(sql: psycopg.Connection[Any]) -> datetime:
    row = sql.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.direct  # finds the waiter's session in pg_stat_activity
def test_a_long_poll_on_a_full_queue_wakes_when_a_lease_ends(
    admin: batonq.Client,
    client: batonq.Client,
    dsn: str,
    sql: psycopg.Connection[Any],
    long_poll: Callable[[float], tuple[threading.Thread, list[Any]]],
) -> None:
    admin.configure_queue(Q, max_leased=1)
    first, second = admin.enqueue_many(Q, [{"n": 1}, {"n": 2}])
    [held] = client.claim(Q)
    assert held.task_id == first.task_id
    since = _now(sql)
    thread, answer = long_poll(20)
    wait_for(lambda: _waiting_since(sql, dsn, since), timeout=10, what="the long-poll to sleep")
    client.complete(held.lease_token)
    ended = time.monotonic()
    thread.join(timeout=25)
    [leases, returned] = answer
    assert [lease.task_id for lease in leases] == [second.task_id]
    assert returned - ended < 2.0  # woken: its own poll would come after 30 s


def test_a_long_poll_on_an_empty_rate_bucket_wakes_when_a_token_is_due(
    admin: batonq.Client,
    client: batonq.Client,
    long_poll: Callable[[float], tuple[threading.Thread, list[Any]]],
) -> None:
    admin.configure_queue(Q, rate_limit=1, rate_period_s=2)
    admin.enqueue_many(Q, [{"n": 1}, {"n": 2}])
    assert len(client.claim(Q, max_tasks=2)) == 1  # the bucket's one token
    assert 1.5 < client.rate_wait([Q]) <= 2.0
    started = time.monotonic()
    thread, answer = long_poll(20)
    thread.join(timeout=25)
    [leases, returned] = answer
    assert len(leases) == 1
    assert 1.0 < returned - started < 4.0  # the token's time, not the 30 s poll


def test_a_long_poll_on_a_group_with_an_empty_rate_bucket_wakes_when_its_token_is_due(
    admin: batonq.Client,
    client: batonq.Client,
    long_poll: Callable[[float], tuple[threading.Thread, list[Any]]],
) -> None:
    admin.configure_queue(Q, group_rate_limit=1, rate_period_s=2)
    admin.enqueue(Q, {"n": "a"}, group="a")
    assert len(client.claim(Q)) == 1
    assert client.rate_wait([Q]) == 0  # a's bucket is empty, but no task of a waits
    admin.enqueue_many(Q, [{"n": 1}, {"n": 2}], group="b")
    assert len(client.claim(Q, max_tasks=2)) == 1  # b's one token
    assert 1.5 < client.rate_wait([Q]) <= 2.0
    started = time.monotonic()
    thread, answer = long_poll(20)
    thread.join(timeout=25)
    [leases, returned] = answer
    assert [lease.row for lease in leases] == [{"n": 2}]
    assert 1.0 < returned - started < 4.0  # the token's time, not the 30 s poll


@pytest.mark.parametrize("limit", ["rate_limit", "group_rate_limit"])
def test_a_token_that_came_due_a_moment_ago_still_answers_a_wait(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any], limit: str
) -> None:
    """A claim found the bucket empty; its token comes due before the
    claimer asks how long to sleep (a round trip later). The answer is a
    moment, not 0 ("no rate limit holds you": a whole idle wait)."""
    admin.configure_queue(Q, rate_period_s=10, **{limit: 1})
    admin.enqueue_many(Q, [{"n": 1}, {"n": 2}], group="acme")
    assert len(client.claim(Q, max_tasks=2)) == 1  # the one token
    assert 9.0 < client.rate_wait([Q]) <= 10.0
    # Move the bucket's clock so that its token came due 0.1 s ago.
    if limit == "rate_limit":
        sql.execute("UPDATE batonq.rate_buckets SET tokens = 0, at = clock_timestamp() - interval '10.1 s'"
                    " WHERE queue = %s", (Q,))  # fmt: skip
    else:
        sql.execute("UPDATE batonq.group_rate_buckets SET full_at = clock_timestamp() - interval '0.1 s'"
                    " WHERE queue = %s", (Q,))  # fmt: skip
    assert 0 < client.rate_wait([Q]) < 0.01
    # Long past due, the bucket holds nothing back.
    if limit == "rate_limit":
        sql.execute("UPDATE batonq.rate_buckets SET at = at - interval '1 s' WHERE queue = %s", (Q,))
    else:
        sql.execute("UPDATE batonq.group_rate_buckets SET full_at = full_at - interval '1 s'"
                    " WHERE queue = %s", (Q,))  # fmt: skip
    assert client.rate_wait([Q]) == 0


def test_the_maintenance_prunes_the_rate_buckets_of_groups_idle_for_a_period(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    """A claim makes a bucket per group it takes from (none for tasks
    without a group); a bucket full again (here a second later) goes."""
    admin.configure_queue(Q, group_rate_limit=1, rate_period_s=1)
    admin.enqueue_many(Q, [{"i": i} for i in range(3)], groups=["a", "b", None])
    assert len(client.claim(Q, max_tasks=3)) == 3

    def buckets() -> list[str]:
        query = "SELECT group_key FROM batonq.group_rate_buckets WHERE queue = %s ORDER BY 1"
        rows = sql.execute(query, (Q,))
        return [group for (group,) in rows.fetchall()]

    assert buckets() == ["a", "b"]
    assert admin.maintain()["rate_buckets_deleted"] == 0  # still refilling
    wait_for(lambda: admin.maintain()["rate_buckets_deleted"] == 2, timeout=10, what="idle buckets pruned")
    assert buckets() == []


@pytest.mark.parametrize("limit", ["rate_limit", "group_rate_limit"])
async def test_a_worker_held_back_by_the_rate_limit_sleeps_only_until_the_next_token(
    admin: batonq.Client, dsn: str, limit: str
) -> None:
    """Its idle wait is 30 s; the rate's tokens (the queue's, or the one
    group's) come every 0.1 s, and it takes each one about when it is due."""
    admin.configure_queue(Q, rate_period_s=1, **{limit: 10})
    admin.enqueue_many(Q, [{"i": i} for i in range(25)], group="acme")
    app = batonq.App()

    @app.task(Q)
    def run(job: batonq.Job) -> None:
        return None

    started = time.monotonic()
    worker = batonq.Worker(app, dsn=dsn, handle_signals=False, concurrency=4, wait_s=30, max_tasks=25)
    assert await worker.run_async() == 0
    elapsed = time.monotonic() - started
    # 10 at once (the full bucket), then 15 at 10 a second.
    assert 1.3 < elapsed < 5.0, elapsed


def test_a_lapsed_lease_is_taken_up_again_only_with_room_under_the_limit(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    """A heartbeat takes up its lease that ran out with nobody claiming the
    task since -- unless that would put the queue over its limit."""
    admin.configure_queue(Q, max_leased=1)
    admin.enqueue(Q, {"n": "lapsing"})
    [lapsing] = client.claim(Q)
    admin.enqueue(Q, {"n": "urgent"}, priority=10)
    sql.execute(
        "UPDATE batonq.tasks SET lease_expires_at = now() - interval '1 s' WHERE id = %s", (lapsing.task_id,)
    )
    assert admin.sweep() == 1  # back to pending, its lease token still the task's
    [urgent] = client.claim(Q)
    assert urgent.row == {"n": "urgent"}
    with pytest.raises(batonq.LeaseLost):
        client.heartbeat(lapsing.lease_token)
    client.complete(urgent.lease_token)
    assert client.heartbeat(lapsing.lease_token).accepted
    assert client.claim(Q) == []  # the limit is taken again


def test_a_lapsed_lease_taken_up_again_takes_no_rate_token(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    """The attempt was paid for by its claim: taking its lease up again goes
    on with it, and leaves the bucket's tokens to new claims."""
    admin.configure_queue(Q, rate_limit=2, rate_period_s=3600)
    admin.enqueue_many(Q, [{"n": n} for n in range(3)])
    [lapsing] = client.claim(Q)
    sql.execute(
        "UPDATE batonq.tasks SET lease_expires_at = now() - interval '1 s' WHERE id = %s", (lapsing.task_id,)
    )
    assert admin.sweep() == 1
    assert client.heartbeat(lapsing.lease_token).accepted
    assert len(client.claim(Q, max_tasks=3)) == 1  # the bucket's second token, as before the lapse
    assert client.claim(Q) == []


def test_the_same_rate_sent_again_keeps_the_buckets_and_a_new_one_fills_them(
    admin: batonq.Client, client: batonq.Client
) -> None:
    """Settings applied again by a deployment must not hand out a new
    bucket each time."""
    admin.configure_queue(Q, rate_limit=3, group_rate_limit=2, rate_period_s=3600)
    admin.enqueue_many(Q, [{"n": n} for n in range(20)], group="g")
    assert len(client.claim(Q, max_tasks=10)) == 2  # the group's bucket
    admin.configure_queue(Q, rate_limit=3, group_rate_limit=2, rate_period_s=3600)
    assert client.claim(Q, max_tasks=10) == []
    admin.configure_queue(Q, group_rate_limit=0)
    assert len(client.claim(Q, max_tasks=10)) == 1  # the queue's third token
    admin.configure_queue(Q, rate_limit=3, rate_period_s=3600.0)
    assert client.claim(Q, max_tasks=10) == []
    admin.configure_queue(Q, rate_limit=4)  # a new rate: a full bucket
    assert len(client.claim(Q, max_tasks=10)) == 4


def test_a_tasks_group_is_shown_on_the_task_and_its_lease_hot_and_archived(admin: batonq.Client) -> None:
    one = admin.enqueue(Q, {"n": 1}, group="customer-7")
    both = admin.enqueue_many(Q, [{"n": 2}, {"n": 3}], group="customer-8")
    mixed = admin.enqueue_many(Q, [{"n": 4}, {"n": 5}], groups=["customer-9", None])
    with pytest.raises(batonq.InvalidArgument, match="group or groups"):
        admin.enqueue_many(Q, [{}], group="a", groups=["b"])
    groups = {e.task_id: admin.task(e.task_id).group for e in [one, *both, *mixed]}
    assert list(groups.values()) == ["customer-7", "customer-8", "customer-8", "customer-9", None]
    leases = admin.claim(Q, max_tasks=5)
    assert {lease.task_id: lease.group for lease in leases} == groups
    admin.complete(leases[0].lease_token)
    assert admin.task(leases[0].task_id).state == "done"
    assert admin.task(leases[0].task_id).group == groups[leases[0].task_id]
    # Debounced: the window's task takes the group with the payload it keeps.
    first = admin.enqueue("limits:debounced", {"v": 1}, group="a", debounce_key="k", debounce_s=60)
    admin.enqueue("limits:debounced", {"v": 2}, group="b", debounce_key="k", debounce_s=60)
    task = admin.task(first.task_id)
    assert (task.payload, task.group) == ({"v": 2}, "b")


def test_a_batons_task_is_in_its_parents_group_and_counts_against_its_limits(admin: batonq.Client) -> None:
    admin.add_edge("limits:orders", "limits:invoices")
    admin.add_edge("limits:orders", "limits:lines", fan_out="/lines")
    admin.add_edge("limits:lines", "limits:totals", join=True)
    admin.configure_queue("limits:invoices", group_max_leased=1)
    admin.enqueue_many("limits:orders", [{"n": 1}, {"n": 2}], group="acme")
    admin.enqueue("limits:orders", {"n": 3})
    for lease in admin.claim("limits:orders", max_tasks=3):
        admin.complete(lease.lease_token, {"lines": [1, 2]})

    # Plain edge: the batch's batons in one statement, each in its parent's group.
    invoices = admin.tasks("limits:invoices", limit=10)
    assert sorted((t.group or "") for t in invoices) == ["", "acme", "acme"]
    # acme's limit of 1 holds for its batons: one of its two, and the task without a group.
    leases = admin.claim("limits:invoices", max_tasks=3)
    assert sorted((lease.group or "") for lease in leases) == ["", "acme"]

    # Fan-out elements and their join: one by one, in the parent's group too.
    lines = admin.claim("limits:lines", max_tasks=6)
    assert sorted((lease.group or "") for lease in lines) == ["", "", "acme", "acme", "acme", "acme"]
    for lease in lines:
        admin.complete(lease.lease_token, lease.row)
    totals = admin.claim("limits:totals", max_tasks=3)
    assert sorted((lease.group or "") for lease in totals) == ["", "acme", "acme"]
