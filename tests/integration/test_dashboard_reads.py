"""The engine's reads behind the dashboard (engine/dashboard.sql), as the
reader role: scopes applied in SQL match the keys' glob patterns exactly,
pages and filters return what they say, scorecards count per worker."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import age

import batonq
from batonq.errors import LeaseLost, TaskFinished
from batonq.rings import covers, scope_regex


@pytest.fixture
def reader(reader_dsn: str) -> Any:
    with batonq.connect(reader_dsn) as c:
        yield c


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pattern=st.text(alphabet="ab:.*?[]!-", min_size=1, max_size=8),
    name=st.text(alphabet="ab:.-", min_size=1, max_size=8),
)
def test_scope_regexes_match_what_the_glob_patterns_cover(
    sql: psycopg.Connection[Any], pattern: str, name: str
) -> None:
    [(matched,)] = sql.execute("SELECT %s ~ %s", (name, scope_regex(pattern))).fetchall()
    assert matched == covers([pattern], name), scope_regex(pattern)


def test_queue_pages_keep_to_scopes_and_search(admin: batonq.Client, reader: batonq.Client) -> None:
    for name in ("shop:a", "shop:b", "shop:c", "mail:x", "shopping"):
        admin.enqueue(name, None)
    assert [q.queue for q in reader.queue_page(["shop:*"], limit=2)] == ["shop:a", "shop:b"]
    assert [q.queue for q in reader.queue_page(["shop:*"], after="shop:b")] == ["shop:c"]
    found = reader.queue_page(["*"], search="OP")
    assert [q.queue for q in found] == ["shop:a", "shop:b", "shop:c", "shopping"]
    assert reader.queue_count(["shop:*", "mail:?"]) == 4
    assert reader.queue_count(["shop:*"], search="c") == 1
    [a] = reader.queue_page(["shop:a"])
    assert (a.pending, a.done) == (1, 0)


def test_tasks_by_key_worker_and_dead_letters(admin: batonq.Client, reader: batonq.Client) -> None:
    keyed = admin.enqueue("f:q", {"n": 1}, idempotency_key="order-1")
    admin.enqueue("f:q", {"n": 2})
    [lease] = admin.claim("f:q", worker="w-dead")
    admin.fail(lease.lease_token, "card declined", requeue=False)
    other = admin.enqueue("g:q", None)
    [lease] = admin.claim("g:q", worker="w-dead")
    admin.fail(lease.lease_token, "timeout", requeue=False)

    assert [t.id for t in reader.find_tasks("f:q", idempotency_key="order-1")] == [keyed.task_id]
    assert [t.id for t in reader.find_tasks("f:q", idempotency_key="order-1", state="pending")] == []
    assert [t.worker for t in reader.find_tasks("f:q", worker="w-dead")] == ["w-dead"]
    assert reader.find_tasks("f:q", worker="nobody") == []
    assert [t.id for t in reader.dead_tasks(["g:*"])] == [other.task_id]
    assert [t.last_error for t in reader.dead_tasks(["*"], error="DECLINED")] == ["card declined"]
    assert len(reader.dead_tasks(["*"])) == 2
    assert [t.queue for t in reader.dead_tasks(["*"], limit=1)] == ["g:q"]
    assert [t.queue for t in reader.dead_tasks(["*"], before_id=other.task_id)] == ["f:q"]


def test_the_scheduled_filter_lists_the_pending_not_due_yet(
    admin: batonq.Client, reader: batonq.Client
) -> None:
    later = admin.enqueue("sch:q", {"n": 1}, delay_s=3600, idempotency_key="later")
    now = admin.enqueue("sch:q", {"n": 2})
    latest = admin.enqueue("sch:q", {"n": 3}, delay_s=3600)
    [lease] = admin.claim("sch:q", worker="w-1")
    assert lease.task_id == now.task_id
    admin.complete(lease.lease_token, None)
    due = admin.enqueue("sch:q", {"n": 4})

    scheduled = [t.id for t in reader.tasks("sch:q", state="scheduled")]
    assert scheduled == [latest.task_id, later.task_id]
    assert [t.id for t in reader.tasks("sch:q", state="pending")] == [due.task_id, *scheduled]
    assert [t.id for t in reader.tasks("sch:q", state="scheduled", limit=1)] == scheduled[:1]
    keyed = reader.find_tasks("sch:q", idempotency_key="later", state="scheduled")
    assert [t.id for t in keyed] == [later.task_id]
    assert reader.find_tasks("sch:q", worker="w-1", state="scheduled") == []
    with pytest.raises(batonq.InvalidArgument, match="pending, scheduled, leased"):
        reader.tasks("sch:q", state="soon")


def test_a_key_is_found_across_the_queues_in_scope(admin: batonq.Client, reader: batonq.Client) -> None:
    shop = admin.enqueue("shop:orders", {"n": 1}, idempotency_key="order-77")
    mail = admin.enqueue("mail:out", {"n": 2}, idempotency_key="order-77")
    [lease] = admin.claim("mail:out")
    admin.complete(lease.lease_token, None)  # archived: found all the same
    admin.enqueue("shop:orders", {"n": 3}, idempotency_key="order-78")

    assert [(t.id, t.state) for t in reader.tasks_by_key("order-77")] == [
        (mail.task_id, "done"), (shop.task_id, "pending")
    ]  # fmt: skip
    assert [t.id for t in reader.tasks_by_key("order-77", ["shop:*"])] == [shop.task_id]
    assert [t.id for t in reader.tasks_by_key("order-77", limit=1)] == [mail.task_id]
    assert reader.tasks_by_key("order-7") == [] and reader.tasks_by_key("order-77", ["billing:*"]) == []


def test_throughput_counts_finishes_per_minute(admin: batonq.Client, reader: batonq.Client) -> None:
    for i in range(3):
        admin.enqueue("tp:q", i)
    for lease in admin.claim("tp:q", max_tasks=3):
        admin.complete(lease.lease_token, None)
    rows = reader.throughput(["tp:q", "tp:none"])
    assert sum(r.done for r in rows) == 3 and {r.queue for r in rows} == {"tp:q"}


def test_scorecards_count_each_attempt_for_its_worker(
    admin: batonq.Client, reader: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    admin.enqueue("sc:q", 1)
    [done] = admin.claim("sc:q", worker="good")
    admin.complete(done.lease_token, "ok")
    admin.enqueue("sc:q", 2, max_attempts=2)
    [first] = admin.claim("sc:q", worker="flaky")
    admin.fail(first.lease_token, "oops", retry_delay_s=0)
    [second] = admin.claim("sc:q", worker="flaky")
    admin.fail(second.lease_token, "oops again")  # the last attempt: dead
    # A late complete after a cancel: under the newest lease, its holder is known.
    cancelled = admin.enqueue("sc:q", 3)
    [zombie] = admin.claim("sc:q", worker="zombie")
    admin.cancel(cancelled.task_id)
    with pytest.raises((LeaseLost, TaskFinished)):
        admin.complete(zombie.lease_token, "late")
    # A late complete after the lease expired and another worker took over.
    admin.enqueue("sc:q", 4)
    [lost] = admin.claim("sc:q", worker="slow", lease_s=1)
    age(sql, 5)
    admin.sweep()
    [taken] = admin.claim("sc:q", worker="fast")
    with pytest.raises(LeaseLost):
        admin.complete(lost.lease_token, "late")

    # Two workers on one task: the first fails, the second finishes it.
    admin.enqueue("sc:q", 5)
    [tried] = admin.claim("sc:q", worker="flaky")
    admin.fail(tried.lease_token, "flaked", retry_delay_s=0)
    [rescue] = admin.claim("sc:q", worker="good")
    admin.complete(rescue.lease_token, "ok")
    [entry] = admin.task(tried.task_id).errors  # each lease that ended unfinished: who, from when to when
    assert (entry["worker"], entry["fencing_token"]) == ("flaky", tried.fencing_token)
    assert datetime.fromisoformat(entry["started_at"]) <= datetime.fromisoformat(entry["at"])

    cards = {c.worker: c for c in reader.worker_scorecards(["sc:*"])}
    assert (cards["good"].done, cards["good"].failed, cards["good"].dead) == (2, 0, 0)
    assert cards["good"].median_s is not None and cards["good"].last_seen is not None
    assert (cards["flaky"].done, cards["flaky"].failed, cards["flaky"].dead) == (0, 3, 1)
    assert cards["zombie"].late_writes == 1
    # slow's lease expired: the expiry and its late write are slow's, not fast's
    assert (cards["slow"].failed, cards["slow"].late_writes) == (1, 1)
    assert (cards["fast"].failed, cards["fast"].late_writes) == (0, 0)
    assert None not in cards
    assert reader.worker_scorecards(["other:*"]) == []
    assert [w.fencing_token for w in reader.set_aside_writes([taken.task_id])] == [lost.fencing_token]
