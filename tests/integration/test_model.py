"""The engine against a small pure-Python model of one queue's task states.

A hypothesis state machine drives random sequences of enqueue, claim,
heartbeat, complete, fail, release, sweep and clock advances (``age``) and
checks after every step that the engine's replies, refusals and stored rows
are what the model predicts.

Time: the model keeps every deadline on the database's clock, shifted by how
far ``age`` has moved it (``aged``), and reads exact timestamps back from the
engine's replies. Before any operation that compares a deadline with the
database's ``now()`` (claim, sweep, queue_stats) the clock is nudged so that
no deadline sits within a fraction of a second of "now": the outcome is then
never a race against real time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from tests.conftest import age

import batonq

Q = "model:q"
HOT = ("pending", "leased")
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 100.0
DEFAULT_MAX_ATTEMPTS = 3
KEYS = ("k0", "k1", "k2")
PRIORITIES = st.sampled_from([0, 0, 1, 5])
DELAYS = st.sampled_from([0, 0, 5, 30])
MAX_ATTEMPTS = st.sampled_from([None, 1, 2, 3])
# No deadline may sit this close to the database's now() when an operation
# compares against it: real time passes between our reading and its now().
BEHIND_S, AHEAD_S = 0.3, 2.0
# Our wall clock against the database's transaction start.
CLOCK_SLACK_S = 0.05


@dataclass
class MTask:
    """One task as the model sees it; times are on the model's clock."""

    id: int
    priority: int
    run_at: float
    max_attempts: int
    key: str | None
    state: str = "pending"
    attempts: int = 0
    fencing: int | None = None
    secret_live: bool = False  # lease_secret IS NOT NULL: the current token may write
    # The row, hot or archived, keeps the current token's secret: a write
    # with that token and another secret is a forged one. A fail that
    # retries and a release clear it; finishing keeps it.
    secret_kept: bool = False
    lease_s: int | None = None
    lease_expires: float | None = None
    errors: int = 0

    def give_up_lease(self) -> None:
        self.secret_live = False
        self.lease_expires = None


@dataclass(frozen=True)
class Expect:
    """What a write about a lease should get: accepted, replayed (with the
    first outcome's state), invalid_token, lease_lost or finished."""

    outcome: str
    state: str | None = None


class Model:
    def __init__(self) -> None:
        self.tasks: dict[int, MTask] = {}
        self.keys: dict[str, int] = {}
        # (task, fencing token) -> the first accepted complete or fail, and the state after it
        self.outcomes: dict[tuple[int, int], tuple[str, str]] = {}
        self.max_token = 0
        self.aged = 0.0

    def now(self) -> float:
        return time.time() + self.aged

    def deadlines(self) -> list[float]:
        found = []
        for t in self.tasks.values():
            if t.state == "leased" and t.lease_expires is not None:
                found.append(t.lease_expires)
            elif t.state == "pending":
                found.append(t.run_at)
        return found

    def expire(self, now: float) -> int:
        """batonq.expire_leases: expired leases go back to pending (keeping
        their token and secret), or die once out of attempts."""
        count = 0
        for t in self.tasks.values():
            if t.state == "leased" and t.lease_expires is not None and t.lease_expires < now:
                count += 1
                t.errors += 1
                t.lease_expires = None
                if t.attempts < t.max_attempts:
                    t.state = "pending"
                else:
                    t.state = "dead"
                    t.secret_live = False
        return count

    def claimable(self, now: float) -> list[MTask]:
        ready = [t for t in self.tasks.values() if t.state == "pending" and t.run_at <= now]
        return sorted(ready, key=lambda t: (-t.priority, t.run_at, t.id))

    def expect(self, kind: str, lease: batonq.Lease, forged: bool = False) -> Expect:
        t = self.tasks[lease.task_id]
        current = t.state in HOT and t.fencing == lease.fencing_token and t.secret_live
        if current and not forged:
            return Expect("accepted")
        # A replay is the same write kind from the same lease.
        first = self.outcomes.get((t.id, lease.fencing_token))
        if not forged and first is not None and first[0] == kind:
            return Expect("replayed", first[1])
        if forged and t.fencing == lease.fencing_token and t.secret_kept:
            return Expect("invalid_token")
        return Expect("lease_lost" if t.state in HOT else "finished", t.state)

    def counts(self, now: float) -> dict[str, int]:
        counts = dict.fromkeys(("pending", "scheduled", "leased", "done", "dead"), 0)
        for t in self.tasks.values():
            if t.state == "pending" and t.run_at > now:
                counts["scheduled"] += 1
            else:
                counts[t.state] += 1
        return counts


def forge(token: str) -> str:
    """The same lease token with another secret."""
    secret = "0" * 32 if not token.endswith("0" * 32) else "1" * 32
    return token[:-32] + secret


# Which issued lease a rule acts on: an index taken modulo how many there are.
# Not a Bundle: how many leases a claim returns depends on the real time a step
# took, and hypothesis needs the same choices to draw the same way every run.
PICKS = st.integers(min_value=0, max_value=255)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, client: batonq.Client, sql: psycopg.Connection[Any]) -> None:
        super().__init__()
        self.client = client
        self.sql = sql
        sql.execute(
            "TRUNCATE batonq.tasks, batonq.archive, batonq.submits,"
            " batonq.idempotency_keys, batonq.queues CASCADE"
        )
        sql.execute(
            "SELECT batonq.configure_queue(%s, p_backoff_base_s => %s, p_backoff_max_s => %s)",
            (Q, BACKOFF_BASE_S, BACKOFF_MAX_S),
        )
        self.model = Model()
        self.issued: list[batonq.Lease] = []
        self.serial = 0

    # -- the clock ---------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the database's clock forward by about ``seconds`` (0: only as
        far as needed), landing clear of every deadline."""
        now = self.model.now()
        deadlines = self.model.deadlines()
        step = float(seconds)
        while any(now + step - BEHIND_S <= d <= now + step + AHEAD_S for d in deadlines):
            step += 0.25
        if step > 0:
            age(self.sql, step)
            self.model.aged += step

    def stored_run_at(self, task_id: int) -> float:
        row = self.sql.execute(
            "SELECT extract(epoch FROM run_at)::float8 FROM batonq.tasks WHERE id = %s", (task_id,)
        ).fetchone()
        assert row is not None
        return float(row[0]) + self.model.aged

    # -- writes about a lease ---------------------------------------------

    def pick(self, index: int) -> batonq.Lease | None:
        if not self.issued:
            event("no lease issued yet")
            return None
        return self.issued[index % len(self.issued)]

    def write(
        self, expect: Expect, lease: batonq.Lease, call: Callable[[], batonq.Submitted]
    ) -> batonq.Submitted | None:
        """Run ``call`` and check it against ``expect``; the reply when accepted."""
        t = self.model.tasks[lease.task_id]
        event(f"write: {expect.outcome} on a {t.state} task")
        if expect.outcome in ("accepted", "replayed"):
            reply = call()
            assert (reply.outcome, reply.task_id, reply.queue) == (expect.outcome, t.id, Q)
            assert reply.fencing_token == lease.fencing_token
            if expect.state is not None:
                assert reply.state == expect.state
            return reply if expect.outcome == "accepted" else None
        if expect.outcome == "invalid_token":
            with pytest.raises(batonq.InvalidToken):
                call()
            return None
        with pytest.raises(batonq.LeaseLost) as refused:
            call()
        cls = batonq.TaskFinished if expect.outcome == "finished" else batonq.LeaseLost
        assert type(refused.value) is cls
        assert refused.value.task_id == t.id
        assert refused.value.state == expect.state
        assert refused.value.fencing_token == lease.fencing_token
        assert refused.value.current_fencing_token == t.fencing
        return None

    # -- rules ---------------------------------------------------------------

    @initialize(backlog=st.lists(st.tuples(PRIORITIES, DELAYS, MAX_ATTEMPTS), min_size=1, max_size=4))
    def some_tasks(self, backlog: list[tuple[int, int, int | None]]) -> None:
        for priority, delay_s, max_attempts in backlog:
            self.enqueue(priority, delay_s, None, max_attempts)

    @rule(
        priority=PRIORITIES,
        delay_s=DELAYS,
        key=st.none() | st.sampled_from(KEYS),
        max_attempts=MAX_ATTEMPTS,
    )
    def enqueue(self, priority: int, delay_s: int, key: str | None, max_attempts: int | None) -> None:
        self.serial += 1
        before = self.model.now()
        reply = self.client.enqueue(
            Q, {"n": self.serial}, priority=priority, delay_s=delay_s, idempotency_key=key,
            max_attempts=max_attempts,
        )  # fmt: skip
        after = self.model.now()
        if key is not None and key in self.model.keys:
            first = self.model.tasks[self.model.keys[key]]
            assert (reply.created, reply.task_id, reply.state) == (False, first.id, first.state)
            return
        assert (reply.created, reply.state, reply.queue) == (True, "pending", Q)
        assert reply.task_id > max(self.model.tasks, default=0)
        run_at = reply.run_at.timestamp() + self.model.aged
        assert before + delay_s - CLOCK_SLACK_S <= run_at <= after + delay_s + CLOCK_SLACK_S
        self.model.tasks[reply.task_id] = MTask(
            id=reply.task_id,
            priority=priority,
            run_at=run_at,
            max_attempts=max_attempts or DEFAULT_MAX_ATTEMPTS,
            key=key,
        )
        if key is not None:
            self.model.keys[key] = reply.task_id

    @rule(n=st.sampled_from([1, 1, 2, 3, 5]), lease_s=st.sampled_from([10, 30, 60]))
    def claim(self, n: int, lease_s: int) -> None:
        self.advance(0)
        now = self.model.now()
        self.model.expire(now)
        expected = self.model.claimable(now)[:n]
        got = self.client.claim(Q, max_tasks=n, lease_s=lease_s, worker="model")
        assert [lease.task_id for lease in got] == [t.id for t in expected]
        tokens = [lease.fencing_token for lease in got]
        assert len(set(tokens)) == len(tokens)
        assert all(token > self.model.max_token for token in tokens), "fencing tokens only grow"
        self.model.max_token = max([self.model.max_token, *tokens])
        for lease, t in zip(got, expected, strict=True):
            t.state, t.attempts, t.lease_s = "leased", t.attempts + 1, lease_s
            t.fencing, t.secret_live, t.secret_kept = lease.fencing_token, True, True
            t.lease_expires = lease.lease_expires_at.timestamp() + self.model.aged
            assert lease.lease_expires_in_s == lease_s
            assert (lease.attempt, lease.max_attempts) == (t.attempts, t.max_attempts)
            assert (lease.priority, lease.idempotency_key) == (t.priority, t.key)
            assert lease.lease_token.startswith(f"{Q}/{t.id}/{lease.fencing_token}/")
        self.issued += got

    @rule(pick=PICKS, lease_s=st.sampled_from([None, 10, 60]))
    def heartbeat(self, pick: int, lease_s: int | None) -> None:
        lease = self.pick(pick)
        if lease is None:
            return
        t = self.model.tasks[lease.task_id]
        call = lambda: self.client.heartbeat(lease.lease_token, lease_s=lease_s, stage="beat")  # noqa: E731
        reply = self.write(self.model.expect("heartbeat", lease), lease, call)
        if reply is not None:
            # Also takes up a lease that ran out with nobody claiming since.
            t.state = "leased"
            t.lease_s = lease_s or t.lease_s
            assert reply.state == "leased"
            assert reply.lease_expires_at is not None
            assert reply.lease_expires_in_s == t.lease_s, "from the database's now()"
            t.lease_expires = reply.lease_expires_at.timestamp() + self.model.aged

    @rule(pick=PICKS, result=st.sampled_from([None, {"ok": True}, [1, 2]]))
    def complete(self, pick: int, result: Any) -> None:
        lease = self.pick(pick)
        if lease is None:
            return
        t = self.model.tasks[lease.task_id]
        call = lambda: self.client.complete(lease.lease_token, result)  # noqa: E731
        if self.write(self.model.expect("complete", lease), lease, call) is not None:
            t.state = "done"
            t.give_up_lease()
            self.model.outcomes[(t.id, lease.fencing_token)] = ("complete", "done")
            assert self.client.task(t.id).result == result

    @rule(pick=PICKS, mode=st.sampled_from(["retry:0", "retry:5", "retry:30", "backoff", "requeue=False"]))
    def fail(self, pick: int, mode: str) -> None:
        lease = self.pick(pick)
        if lease is None:
            return
        t = self.model.tasks[lease.task_id]
        delay = float(mode.split(":")[1]) if mode.startswith("retry:") else None
        before = self.model.now()
        call = lambda: self.client.fail(  # noqa: E731
            lease.lease_token, {"mode": mode}, retry_delay_s=delay, requeue=mode != "requeue=False"
        )
        if self.write(self.model.expect("fail", lease), lease, call) is None:
            return
        after = self.model.now()
        t.errors += 1
        t.give_up_lease()
        if mode == "requeue=False" or t.attempts >= t.max_attempts:
            t.state = "dead"
        else:
            t.state = "pending"
            t.secret_kept = False
            t.run_at = self.stored_run_at(t.id)
            if delay is None:  # exponential backoff with jitter in [0.5, 1)
                full = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (t.attempts - 1))
                low, high = full / 2, full
            else:
                low = high = delay
            assert before + low - CLOCK_SLACK_S <= t.run_at <= after + high + CLOCK_SLACK_S
        self.model.outcomes[(t.id, lease.fencing_token)] = ("fail", t.state)
        assert self.client.task(t.id).state == t.state

    @rule(pick=PICKS)
    def release_lease(self, pick: int) -> None:
        lease = self.pick(pick)
        if lease is None:
            return
        t = self.model.tasks[lease.task_id]
        call = lambda: self.client.release_lease(lease.lease_token)  # noqa: E731
        if self.write(self.model.expect("release", lease), lease, call) is not None:
            t.state = "pending"
            t.attempts = max(t.attempts - 1, 0)
            t.give_up_lease()
            t.secret_kept = False
            t.run_at = self.stored_run_at(t.id)

    @rule(pick=PICKS, kind=st.sampled_from(["complete", "heartbeat", "fail"]))
    def forged_token(self, pick: int, kind: str) -> None:
        lease = self.pick(pick)
        if lease is None:
            return
        token = forge(lease.lease_token)
        calls: dict[str, Callable[[], batonq.Submitted]] = {
            "complete": lambda: self.client.complete(token, "forged"),
            "heartbeat": lambda: self.client.heartbeat(token),
            "fail": lambda: self.client.fail(token, "forged"),
        }
        assert self.write(self.model.expect(kind, lease, forged=True), lease, calls[kind]) is None

    @rule()
    def sweep(self) -> None:
        self.advance(0)
        expected = self.model.expire(self.model.now())
        assert self.client.sweep() == expected

    @rule(seconds=st.sampled_from([1, 5, 11, 30, 61, 200]))
    def clock_advances(self, seconds: int) -> None:
        self.advance(seconds)

    # -- invariants ----------------------------------------------------------

    @invariant()
    def rows_match_model(self) -> None:
        rows = self.sql.execute(
            """SELECT id, state, attempts, max_attempts, fencing_token, lease_secret IS NOT NULL,
                      jsonb_array_length(errors), priority, extract(epoch FROM run_at)::float8,
                      extract(epoch FROM lease_expires_at)::float8
                 FROM batonq.tasks
               UNION ALL
               SELECT id, state, attempts, max_attempts, fencing_token, false,
                      jsonb_array_length(errors), priority, NULL, NULL
                 FROM batonq.archive"""
        ).fetchall()
        assert len(rows) == len({row[0] for row in rows}), "a task is in exactly one place"
        seen = {}
        for id, state, attempts, max_attempts, token, live, errors, priority, run_at, expires in rows:
            t = self.model.tasks[id]
            seen[id] = (state, attempts, max_attempts, token, live, errors, priority)
            if run_at is not None:
                assert abs(run_at + self.model.aged - t.run_at) < 0.01
            if expires is not None or t.lease_expires is not None:
                assert expires is not None and t.lease_expires is not None
                assert abs(expires + self.model.aged - t.lease_expires) < 0.01
        assert seen == {
            t.id: (t.state, t.attempts, t.max_attempts, t.fencing, t.secret_live, t.errors, t.priority)
            for t in self.model.tasks.values()
        }

    @invariant()
    def one_holder(self) -> None:
        """Of every token ever handed out, at most one per task may still
        write, and it is the newest token that task was given."""
        holders: dict[int, list[int]] = {}
        newest: dict[int, int] = {}
        for lease in self.issued:
            newest[lease.task_id] = max(newest.get(lease.task_id, 0), lease.fencing_token)
            if self.model.expect("heartbeat", lease).outcome == "accepted":
                holders.setdefault(lease.task_id, []).append(lease.fencing_token)
        for task_id, tokens in holders.items():
            assert tokens == [newest[task_id]] == [self.model.tasks[task_id].fencing]

    @invariant()
    def counts_match(self) -> None:
        self.advance(0)
        now = self.model.now()
        [stats] = self.client.queues(Q)
        got = {name: getattr(stats, name) for name in ("pending", "scheduled", "leased", "done", "dead")}
        assert got == self.model.counts(now)
        assert (stats.waiting, stats.held, stats.cancelled) == (0, 0, 0)


def test_engine_matches_model(client: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    class OnThisDatabase(QueueMachine):
        def __init__(self) -> None:
            super().__init__(client, sql)

    run_state_machine_as_test(
        OnThisDatabase,
        settings=settings(
            max_examples=50,
            stateful_step_count=40,
            deadline=None,
            # Shrinking a failure here takes minutes of database round trips;
            # the unshrunk steps (printed in full) are short enough to read.
            phases=(Phase.explicit, Phase.reuse, Phase.generate),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
