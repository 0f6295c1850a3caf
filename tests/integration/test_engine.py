"""The engine's guarantees for a single queue, through the sync client."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from tests.conftest import age

import batonq

pytestmark = pytest.mark.smoke

Q = "shop:tasks"


def test_enqueue_claim_complete_roundtrip(client: batonq.Client) -> None:
    enq = client.enqueue(Q, {"order": 17})
    assert enq.created and enq.state == "pending"

    [lease] = client.claim(Q, lease_s=30)
    assert lease.task_id == enq.task_id
    assert lease.row == {"order": 17}
    assert lease.attempt == 1
    assert 29 <= lease.lease_expires_in_s <= 30
    assert lease.lease_token not in repr(lease)

    done = client.complete(lease.lease_token, {"shipped": True})
    assert (done.outcome, done.state) == ("accepted", "done")
    task = client.task(f"t_{enq.task_id}")
    assert (task.state, task.result, task.attempts) == ("done", {"shipped": True}, 1)
    assert client.claim(Q) == []


def test_tokens_only_grow(client: batonq.Client) -> None:
    client.enqueue_many(Q, [{"i": i} for i in range(20)])
    seen: list[int] = []
    for _ in range(4):
        seen += [lease.fencing_token for lease in client.claim(Q, max_tasks=5)]
    assert len(set(seen)) == 20
    assert min(seen[5:10]) > max(seen[:5])


def test_a_tasks_token_grows_even_when_the_sequence_is_behind_it(
    client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    """A sequence restored lower (or one node's range under Citus) still
    gives a task a token above its last, so its stale holder stays fenced."""
    client.enqueue(Q, {"n": 1})
    sql.execute("SELECT setval('batonq.fencing_seq', 1000)")
    [a] = client.claim(Q, lease_s=60, worker="A")
    assert a.fencing_token == 1001
    sql.execute("ALTER SEQUENCE batonq.fencing_seq RESTART WITH 1")
    age(sql, 61)
    [b] = client.claim(Q, lease_s=60, worker="B")
    assert (b.task_id, b.fencing_token) == (a.task_id, 1002)
    with pytest.raises(batonq.LeaseLost):
        client.complete(a.lease_token, {"by": "A"})
    assert client.complete(b.lease_token, {"by": "B"}).outcome == "accepted"


def test_zombie_write_is_refused_and_set_aside(client: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    client.enqueue(Q, {"n": 1})
    [a] = client.claim(Q, lease_s=60, worker="A")
    age(sql, 61)
    [b] = client.claim(Q, lease_s=60, worker="B")
    assert b.task_id == a.task_id and b.fencing_token > a.fencing_token and b.attempt == 2

    with pytest.raises(batonq.LeaseLost) as lost:
        client.complete(a.lease_token, {"by": "A"})
    assert lost.value.state == "leased"
    assert lost.value.current_fencing_token == b.fencing_token
    with pytest.raises(batonq.LeaseLost):
        client.heartbeat(a.lease_token)

    assert client.complete(b.lease_token, {"by": "B"}).outcome == "accepted"
    assert client.task(a.task_id).result == {"by": "B"}
    with pytest.raises(batonq.TaskFinished) as finished:
        client.complete(a.lease_token, {"by": "A"})
    assert finished.value.state == "done"

    ledger = sql.execute(
        "SELECT fencing_token, kind, outcome FROM batonq.submits WHERE task_id = %s ORDER BY at, kind",
        (a.task_id,),
    ).fetchall()
    assert (a.fencing_token, "complete", "set_aside") in ledger
    assert (a.fencing_token, "heartbeat", "set_aside") in ledger
    assert [row for row in ledger if row[2] == "accepted"] == []
    # The accepted complete is the archive row, under B's token.
    archived = sql.execute("SELECT fencing_token, result FROM batonq.archive WHERE id = %s", (a.task_id,))
    assert archived.fetchall() == [(b.fencing_token, {"by": "B"})]


def test_expired_lease_nobody_claimed_may_still_complete(
    client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    client.enqueue(Q, 1)
    [lease] = client.claim(Q, lease_s=5)
    age(sql, 10)
    assert client.sweep() == 1
    assert client.task(lease.task_id).state == "pending"
    assert client.complete(lease.lease_token, 2).outcome == "accepted"


def test_repeated_complete_is_replayed(client: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    client.enqueue(Q, 1)
    [lease] = client.claim(Q)
    first = client.complete(lease.lease_token, {"v": 1})
    again = client.complete(lease.lease_token, {"v": 2})
    assert (first.replayed, again.replayed) == (False, True)
    assert again.state == "done"
    assert client.task(lease.task_id).result == {"v": 1}
    rows = sql.execute("SELECT count(*) FROM batonq.archive WHERE id = %s", (lease.task_id,)).fetchone()
    assert rows == (1,)


def test_repeated_fail_is_replayed(client: batonq.Client) -> None:
    client.enqueue(Q, 1)
    [lease] = client.claim(Q)
    assert client.fail(lease.lease_token, "e1", retry_delay_s=60).state == "pending"
    again = client.fail(lease.lease_token, "e1", retry_delay_s=60)
    assert again.replayed and again.state == "pending"
    assert len(client.task(lease.task_id).errors) == 1


def test_complete_many(client: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    client.enqueue_many(Q, list(range(10)))
    leases = client.claim(Q, max_tasks=10, lease_s=60)
    first = client.complete_many([(lease.lease_token, lease.row * 2) for lease in leases[:5]])
    assert [r.outcome for r in first] == ["accepted"] * 5
    stale = leases[5]
    age(sql, 61)
    [newer] = client.claim(Q, max_tasks=1)
    mixed = client.complete_many([(lease.lease_token, lease.row * 2) for lease in leases[:8]])
    outcomes = {r.task_id: r.outcome for r in mixed}
    assert [outcomes[lease.task_id] for lease in leases[:5]] == ["replayed"] * 5
    assert outcomes[stale.task_id] == ("lease_lost" if newer.task_id == stale.task_id else "accepted")
    assert [r.task_id for r in mixed] == [lease.task_id for lease in leases[:8]]
    assert client.task(leases[0].task_id).result == leases[0].row * 2


def test_complete_many_across_queues(client: batonq.Client) -> None:
    """One batch of two queues' leases (the token-only form, per queue
    inside): every item answered in the batch's order, a forged one too."""
    client.enqueue_many(Q, [1, 2])
    client.enqueue_many("mail:tasks", [3, 4])
    leases = client.claim(Q, max_tasks=2) + client.claim("mail:tasks", max_tasks=2)
    mixed = [leases[2], leases[0], leases[3], leases[1]]
    forged = leases[1].lease_token[:-32] + "0" * 32
    replies = client.complete_many([(lease.lease_token, lease.row * 10) for lease in mixed] + [(forged, 0)])
    assert [(r.task_id, r.queue, r.outcome) for r in replies] == [
        (lease.task_id, lease.queue, "accepted") for lease in mixed
    ] + [(leases[1].task_id, Q, "invalid_token")]
    assert [client.task(lease.task_id).result for lease in mixed] == [30, 10, 40, 20]


def test_idempotent_enqueue(client: batonq.Client) -> None:
    a = client.enqueue(Q, {"v": 1}, idempotency_key="shard-07")
    b = client.enqueue(Q, {"v": 2}, idempotency_key="shard-07")
    assert a.created and not b.created and a.task_id == b.task_id
    assert client.task(a.task_id).payload == {"v": 1}
    many = client.enqueue_many(Q, [1, 2, 3, 4], idempotency_keys=["shard-07", "x", "x", None])
    assert [e.created for e in many] == [False, True, False, True]
    assert many[0].task_id == a.task_id and many[1].task_id == many[2].task_id
    other = client.enqueue("mail:tasks", 1, idempotency_key="shard-07")
    assert other.created and other.task_id != a.task_id


def test_key_kept_after_the_task_finishes(client: batonq.Client) -> None:
    a = client.enqueue(Q, 1, idempotency_key="once")
    [lease] = client.claim(Q)
    client.complete(lease.lease_token, None)
    b = client.enqueue(Q, 1, idempotency_key="once")
    assert (b.created, b.task_id, b.state) == (False, a.task_id, "done")


def test_priority_then_oldest_first(client: batonq.Client) -> None:
    low = client.enqueue(Q, "low", priority=0)
    high_old = client.enqueue(Q, "high-old", priority=5)
    high_new = client.enqueue(Q, "high-new", priority=5)
    order = [lease.task_id for lease in client.claim(Q, max_tasks=3)]
    assert order == [high_old.task_id, high_new.task_id, low.task_id]


def test_delay(client: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    client.enqueue(Q, "later", delay_s=30)
    assert client.claim(Q) == []
    [stats] = client.queues(Q)
    assert (stats.pending, stats.scheduled) == (0, 1)
    age(sql, 31)
    [lease] = client.claim(Q)
    assert lease.row == "later"


def test_fail_with_backoff_then_dead(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    admin.configure_queue(Q, backoff_base_s=10, backoff_max_s=100)
    t = client.enqueue(Q, 1, max_attempts=3)
    delays = []
    for attempt in range(1, 4):
        [lease] = client.claim(Q)
        assert lease.attempt == attempt
        # The fail's own clock lies between these two: its delay is at least
        # run_at - after and at most run_at - before.
        before = sql.execute("SELECT clock_timestamp()").fetchone()
        reply = client.fail(lease.lease_token, {"msg": f"boom {attempt}"})
        after = sql.execute("SELECT clock_timestamp()").fetchone()
        if attempt < 3:
            assert reply.state == "pending" and before is not None and after is not None
            row = sql.execute(
                "SELECT extract(epoch FROM run_at - %s), extract(epoch FROM run_at - %s)"
                " FROM batonq.tasks WHERE id = %s",
                (after[0], before[0], t.task_id),
            ).fetchone()
            assert row is not None
            delays.append((row[0], row[1]))
            assert client.claim(Q) == []
            age(sql, 200)
        else:
            assert reply.state == "dead"
    # base 10 s doubling, jittered down by at most half
    (low1, high1), (low2, high2) = delays
    assert high1 >= 5 and low1 <= 10, delays
    assert high2 >= 10 and low2 <= 20, delays
    task = client.task(t.task_id)
    assert task.state == "dead" and task.last_error == '{"msg": "boom 3"}'
    assert [e["error"] for e in task.errors] == [{"msg": f"boom {i}"} for i in (1, 2, 3)]


def test_retry_delay_and_no_requeue(client: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    t = client.enqueue(Q, 1)
    [lease] = client.claim(Q)
    client.fail(lease.lease_token, "later", retry_delay_s=45)
    assert client.claim(Q) == []
    age(sql, 46)
    [lease] = client.claim(Q)
    reply = client.fail(lease.lease_token, "for good", requeue=False)
    assert reply.state == "dead"
    task = client.task(t.task_id)
    assert (task.state, task.attempts, task.last_error) == ("dead", 2, "for good")


def test_operator_retry_of_dead_task(admin: batonq.Client, client: batonq.Client) -> None:
    t = client.enqueue(Q, 1)
    [lease] = client.claim(Q)
    client.fail(lease.lease_token, "bad", requeue=False)
    revived = admin.retry(t.task_id)
    assert (revived.state, revived.attempts) == ("pending", 0)
    assert revived.errors[0]["error"] == "bad"
    [again] = client.claim(Q)
    assert again.task_id == t.task_id and again.fencing_token > lease.fencing_token
    # The old lease ended with its fail: a complete under it is no replay.
    with pytest.raises(batonq.LeaseLost, match="under fencing token"):
        client.complete(lease.lease_token, "stale")
    client.complete(again.lease_token, "ok")
    assert client.task(t.task_id).result == "ok"
    with pytest.raises(
        batonq.InvalidState, match=r"cannot retry task \d+: it is done, not dead or cancelled"
    ):
        admin.retry(t.task_id)


def test_hold_release_cancel(admin: batonq.Client, client: batonq.Client) -> None:
    t = client.enqueue(Q, 1)
    assert admin.hold(t.task_id).state == "held"
    assert client.claim(Q) == []
    assert admin.release(t.task_id).state == "pending"
    held = client.enqueue(Q, 2, held=True)
    assert held.state == "held"
    [lease] = client.claim(Q, max_tasks=5)
    assert lease.task_id == t.task_id
    assert admin.cancel(t.task_id).state == "cancelled"
    with pytest.raises(batonq.TaskFinished):
        client.complete(lease.lease_token, 1)
    with pytest.raises(batonq.InvalidState):
        admin.hold(t.task_id)
    with pytest.raises(batonq.TaskNotFound):
        admin.release(10**12)


def test_pause_resume(admin: batonq.Client, client: batonq.Client) -> None:
    client.enqueue(Q, 1)
    admin.pause(Q)
    assert client.claim(Q) == []
    assert client.queues(Q)[0].paused
    admin.resume(Q)
    assert len(client.claim(Q)) == 1


def test_heartbeat_extends_and_sets_stage(client: batonq.Client) -> None:
    client.enqueue(Q, 1)
    [lease] = client.claim(Q, lease_s=10)
    beat = client.heartbeat(lease.lease_token, lease_s=3600, stage="ranking")
    assert beat.lease_expires_in_s is not None and 3599 <= beat.lease_expires_in_s <= 3600
    task = client.task(lease.task_id)
    assert task.stage == "ranking"
    client.set_stage(lease.lease_token, "summing up")
    assert client.task(lease.task_id).stage == "summing up"


def test_release_lease_is_claimable_at_once(client: batonq.Client) -> None:
    client.enqueue(Q, 1)
    [lease] = client.claim(Q)
    client.release_lease(lease.lease_token)
    [again] = client.claim(Q)
    assert again.task_id == lease.task_id and again.attempt == 1


def test_lease_expiry_counts_attempts_until_dead(client: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    t = client.enqueue(Q, 1)
    for attempt in (1, 2, 3):
        [lease] = client.claim(Q, lease_s=5)
        assert lease.attempt == attempt
        age(sql, 6)
    assert client.claim(Q) == []
    task = client.task(t.task_id)
    assert task.state == "dead"
    assert task.last_error == "lease expired after max attempts"
    assert len(task.errors) == 3


def test_lists_and_counts(client: batonq.Client) -> None:
    client.enqueue_many(Q, list(range(5)))
    leases = client.claim(Q, max_tasks=3)
    client.complete(leases[0].lease_token, "r")
    client.fail(leases[1].lease_token, "x", requeue=False)
    [stats] = client.queues(Q)
    assert (stats.pending, stats.leased, stats.done, stats.dead) == (2, 1, 1, 1)
    assert stats.oldest_pending_age_s is not None and stats.oldest_pending_age_s >= 0
    assert [t.id for t in client.tasks(Q, state="dead")] == [leases[1].task_id]
    everything = client.tasks(Q)
    assert [t.id for t in everything] == sorted((t.id for t in everything), reverse=True)
    assert len(everything) == 5
    page = client.tasks(Q, limit=2)
    rest = client.tasks(Q, limit=10, before_id=page[-1].id)
    assert len(page) == 2 and len(rest) == 3
    with pytest.raises(batonq.InvalidArgument, match="state must be one of"):
        client.tasks(Q, state="sleeping")


def test_claim_checks_arguments_even_for_a_new_queue(client: batonq.Client) -> None:
    for queue in ("never-used", Q):
        with pytest.raises(batonq.InvalidArgument, match="lease_s must be between 1 and 3600"):
            client.claim(queue, lease_s=0)
        with pytest.raises(batonq.InvalidArgument, match="max_tasks must be between 1 and 10000"):
            client.claim(queue, max_tasks=0)
        client.enqueue(Q, 1)


def forged(lease_token: str) -> str:
    """The same queue, task and fencing token with another secret."""
    head, _, secret = lease_token.rpartition("/")
    return f"{head}/{'0' * 32 if secret != '0' * 32 else '1' * 32}"


def test_a_replay_is_the_same_write_from_the_same_lease(
    client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    # A complete after a fail on the same lease: the fail gave the lease up.
    failed = client.enqueue(Q, "f")
    [lease] = client.claim(Q)
    client.fail(lease.lease_token, "boom", retry_delay_s=60)
    assert client.fail(lease.lease_token, "boom", retry_delay_s=60).replayed
    gave_up = rf"^lease no longer held: task t_{failed.task_id} is pending$"
    with pytest.raises(batonq.LeaseLost, match=gave_up):
        client.complete(lease.lease_token, "late result")
    assert client.task(failed.task_id).result is None

    # A fail after a complete: the task is done.
    done = client.enqueue(Q, "c")
    [lease] = client.claim(Q)
    client.complete(lease.lease_token, "ok")
    assert client.complete(lease.lease_token, "ok").replayed
    with pytest.raises(batonq.TaskFinished, match="is done"):
        client.fail(lease.lease_token, "too late")
    # The right fencing token with a wrong secret, on a finished task or a
    # failed one: a forged token, not a replay.
    with pytest.raises(batonq.InvalidToken, match=f"wrong lease token for task {done.task_id}"):
        client.complete(forged(lease.lease_token), "forged")
    dead = client.enqueue(Q, "d")
    [lease] = client.claim(Q)
    client.fail(lease.lease_token, "no", requeue=False)
    with pytest.raises(batonq.InvalidToken):
        client.fail(forged(lease.lease_token), "no", requeue=False)
    with pytest.raises(batonq.TaskFinished, match="is dead"):
        client.complete(lease.lease_token, "after all")
    assert client.task(done.task_id).result == "ok"
    assert client.task(dead.task_id).result is None

    ledger = sql.execute(
        """SELECT task_id, kind, outcome, state_after FROM batonq.submits
            WHERE outcome <> 'accepted' ORDER BY at, task_id, kind"""
    ).fetchall()
    assert ledger == [
        (failed.task_id, "fail", "replayed", "pending"),
        (failed.task_id, "complete", "set_aside", "pending"),
        (done.task_id, "complete", "replayed", "done"),
        (done.task_id, "fail", "set_aside", "done"),
        (dead.task_id, "complete", "set_aside", "dead"),
    ]
