"""The engine against small pure-Python models of what the docs promise.

``QueueMachine``: one queue's task states. A hypothesis state machine drives
random sequences of enqueue, claim, heartbeat, complete, fail, release, sweep
and clock advances (``age``) and checks after every step that the engine's
replies, refusals and stored rows are what the model predicts.

``GraphMachine``: the queue graph (docs/graph.md). Four queues, a fan-out
into a join and a plain edge after it; enqueue, debounced enqueue, claim,
complete, fail (retrying or dead), lease expiry, the operator's cancel,
retry, hold and release, and retention (``maintain``, every queue keeping
finished tasks for 0 s). After every step: every task, hot or archived, is
the model's (queue, state, payload, lineage, join and place in it), so each
join holds exactly its elements' outcomes in element order, no baton is
lost or made twice and no finished task comes back; the counts per state
are the model's; each join's bookkeeping is the model's.

Each runs a bounded number of examples on one database, emptied between
examples. ``BATONQ_MODEL_EXAMPLES=2000`` runs that many instead, for as long
as that takes (hours on a busy machine; pass ``--timeout 0`` to pytest)::

    BATONQ_MODEL_EXAMPLES=2000 pytest --timeout 0 tests/integration/test_model.py

Time: the model keeps every deadline on the database's clock, shifted by how
far ``age`` has moved it (``aged``), and reads exact timestamps back from the
engine's replies. Before any operation that compares a deadline with the
database's ``now()`` (claim, sweep, queue_stats) the clock is nudged so that
no deadline sits within a fraction of a second of "now": the outcome is then
never a race against real time.
"""

from __future__ import annotations

import os
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


# Between examples the database is emptied row by row: with the few rows an
# example makes, far cheaper than a TRUNCATE of every partition.
EMPTY = """DELETE FROM batonq.tasks; DELETE FROM batonq.archive; DELETE FROM batonq.submits;
           DELETE FROM batonq.idempotency_keys; DELETE FROM batonq.joins; DELETE FROM batonq.batons;
           DELETE FROM batonq.debounces; DELETE FROM batonq.finished_counts"""


def clear_step(now: float, deadlines: list[float], seconds: float) -> float:
    """How far to move the clock to go about ``seconds`` forward (0: only as
    far as needed) and land clear of every deadline."""
    step = float(seconds)
    while any(now + step - BEHIND_S <= d <= now + step + AHEAD_S for d in deadlines):
        step += 0.25
    return step


def examples(default: int) -> int:
    """How many examples a model test runs: ``default``, or
    ``$BATONQ_MODEL_EXAMPLES`` for a longer run."""
    return int(os.environ.get("BATONQ_MODEL_EXAMPLES", default))


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
        sql.execute(EMPTY)
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
        step = clear_step(self.model.now(), self.model.deadlines(), seconds)
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
            max_examples=examples(50),
            stateful_step_count=40,
            deadline=None,
            # Shrinking a failure here takes minutes of database round trips;
            # the unshrunk steps (printed in full) are short enough to read.
            phases=(Phase.explicit, Phase.reuse, Phase.generate),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# -- the queue graph ----------------------------------------------------------

SRC, WORK, GATHER, FINAL = "graph:src", "graph:work", "graph:gather", "graph:final"
GRAPH_QUEUES = (SRC, WORK, GATHER, FINAL)
UNFINISHED = ("waiting", "held", "pending", "leased")
FINISHED = ("done", "dead", "cancelled")
GRAPH_MAX_ATTEMPTS = 2
LEASE_S = 60
DEBOUNCE_S = 5
# The states each operator action takes a task from.
ACTS_ON = {"cancel": UNFINISHED, "hold": ("pending",), "release": ("held",), "retry": ("dead", "cancelled")}
RETRY_DELAY_S = 30
# How much a timestamp the engine set to its now() may differ from ours.
NOW_SLACK_S = 5.0


@dataclass
class GTask:
    """One task of the graph as the model sees it; times on the model's clock."""

    id: int
    queue: str
    state: str
    payload: Any
    run_at: float
    parent: int | None = None
    join: int | None = None  # the join task this task is an element of
    index: int | None = None  # its place in that join
    attempts: int = 0
    fencing: int | None = None
    secret_live: bool = False
    lease_expires: float | None = None
    result: Any = None
    gone: bool = False  # past retention: deleted


@dataclass
class GJoin:
    elements: list[int]
    partial: bool
    gathered: bool = False
    gone: bool = False  # its join task is past retention, and its row with it


class GraphModel:
    def __init__(self) -> None:
        self.tasks: dict[int, GTask] = {}
        self.joins: dict[int, GJoin] = {}  # by join task
        self.windows: dict[str, int] = {}  # debounce key -> its task
        self.outcomes: dict[tuple[int, int], tuple[str, str]] = {}
        self.ever_done: set[int] = set()
        self.aged = 0.0

    def now(self) -> float:
        return time.time() + self.aged

    def live(self) -> list[GTask]:
        return [t for t in self.tasks.values() if not t.gone]

    def deadlines(self) -> list[float]:
        found = []
        for t in self.live():
            if t.state == "leased" and t.lease_expires is not None:
                found.append(t.lease_expires)
            elif t.state == "pending":
                found.append(t.run_at)
        return found

    def finish(self, t: GTask, state: str, result: Any = None) -> None:
        """``t`` is done, dead or cancelled: its join learns of it."""
        t.state, t.result = state, result
        t.secret_live, t.lease_expires = False, None
        if state == "done":
            self.ever_done.add(t.id)
        if t.join is None:
            return
        join, gather = self.joins[t.join], self.tasks[t.join]
        if join.gone or join.gathered:
            return
        if state != "done" and not join.partial:
            if gather.state == "waiting":  # dead at once, of its element
                gather.state = "dead"
        elif all(self.tasks[e].state in FINISHED for e in join.elements):
            self.gather(t.join)

    def gather(self, join_id: int) -> bool:
        """A waiting join gathers: pending, with its elements' results in
        element order (null for a dead or cancelled one)."""
        task, join = self.tasks[join_id], self.joins[join_id]
        if task.state != "waiting":
            return False
        join.gathered = True
        task.state = "pending"
        task.payload = [
            self.tasks[e].result if self.tasks[e].state == "done" else None for e in join.elements
        ]
        return True

    def expire(self, queue: str | None, now: float) -> int:
        count = 0
        for t in self.live():
            if queue not in (None, t.queue) or t.state != "leased" or t.lease_expires is None:
                continue
            if t.lease_expires < now:
                count += 1
                if t.attempts < GRAPH_MAX_ATTEMPTS:
                    t.state, t.lease_expires = "pending", None  # the holder may still finish
                else:
                    self.finish(t, "dead")
        return count

    def expect(self, kind: str, lease: batonq.Lease) -> Expect:
        t = self.tasks[lease.task_id]
        if t.gone:
            return Expect("not_found")
        if t.state in HOT and t.fencing == lease.fencing_token and t.secret_live:
            return Expect("accepted")
        first = self.outcomes.get((t.id, lease.fencing_token))
        if first is not None and first[0] == kind:
            return Expect("replayed", first[1])
        return Expect("finished" if t.state in FINISHED else "lease_lost", t.state)

    def retry(self, t: GTask) -> str | None:
        """The state an operator's retry leaves ``t`` in, or None if refused."""
        if t.state not in ("dead", "cancelled"):
            return None
        if t.join is not None and (self.joins[t.join].gone or self.joins[t.join].gathered):
            return None  # its list is made, or gone: no place to take
        own = self.joins.get(t.id)
        if own is None or own.gathered:
            return "pending"
        if not own.partial and any(self.tasks[e].state in ("dead", "cancelled") for e in own.elements):
            return None  # retry the dead element
        return "waiting"

    def counts(self, queue: str, now: float) -> dict[str, int]:
        counts = dict.fromkeys((*UNFINISHED, "scheduled", *FINISHED), 0)
        for t in self.live():
            if t.queue == queue:
                counts["scheduled" if t.state == "pending" and t.run_at > now else t.state] += 1
        return counts


class GraphMachine(RuleBasedStateMachine):
    def __init__(self, client: batonq.Client, admin: batonq.Client, sql: psycopg.Connection[Any]) -> None:
        super().__init__()
        self.client, self.admin, self.sql = client, admin, sql
        sql.execute(EMPTY)  # the queues and edges stay
        if not sql.execute("SELECT FROM batonq.queues WHERE name = %s", (FINAL,)).fetchall():
            for queue in GRAPH_QUEUES:
                admin.configure_queue(queue, max_attempts=GRAPH_MAX_ATTEMPTS, retention_s=0)
        self.model = GraphModel()
        self.issued: list[batonq.Lease] = []
        self.serial = 0

    def advance(self, seconds: float) -> None:
        step = clear_step(self.model.now(), self.model.deadlines(), seconds)
        if step > 0:
            age(self.sql, step)
            self.model.aged += step

    def stored_run_at(self, task_id: int) -> float:
        row = self.sql.execute(
            "SELECT extract(epoch FROM run_at)::float8 FROM batonq.tasks WHERE id = %s", (task_id,)
        ).fetchone()
        assert row is not None
        return float(row[0]) + self.model.aged

    def set_run_at_now(self, t: GTask) -> None:
        """``t`` was made pending now by the engine."""
        t.run_at = self.stored_run_at(t.id)
        assert abs(t.run_at - self.model.now()) < NOW_SLACK_S

    def new_task(self, queue: str, reply: batonq.Enqueued, payload: Any) -> GTask:
        t = GTask(reply.task_id, queue, "pending", payload, reply.run_at.timestamp() + self.model.aged)
        self.model.tasks[t.id] = t
        return t

    def hand_off(self, t: GTask) -> None:
        """The batons ``t``'s completion made: exactly those the edges say,
        each once."""
        made: list[tuple[str, int | None, str, Any]] = []  # queue, index, state, payload
        if t.queue == SRC:
            items = t.result["items"]
            made.append((GATHER, None, "waiting" if items else "pending", []))
            made += [(WORK, i, "pending", item) for i, item in enumerate(items)]
        elif t.queue == WORK and t.join is None:
            made.append((GATHER, None, "pending", [t.result]))  # not fanned out: alone
        elif t.queue == GATHER:
            made.append((FINAL, None, "pending", t.result))
        rows = self.sql.execute(
            "SELECT id, queue, fan_index FROM batonq.tasks WHERE parent_id = %s ORDER BY id", (t.id,)
        ).fetchall()
        assert [(queue, index) for _, queue, index in rows] == [(m[0], m[1]) for m in made]
        join_id = None
        for (task_id, _, _), (queue, index, state, payload) in zip(rows, made, strict=True):
            child = GTask(task_id, queue, state, payload, 0.0, parent=t.id)
            self.model.tasks[task_id] = child
            self.set_run_at_now(child)
            if t.queue == SRC and queue == GATHER:
                join_id = task_id
                self.model.joins[task_id] = GJoin([], partial=self.partial, gathered=state == "pending")
            elif join_id is not None:
                child.join, child.index = join_id, index
                self.model.joins[join_id].elements.append(task_id)

    def write(self, expect: Expect, call: Callable[[], batonq.Submitted]) -> bool:
        """Run ``call`` and check it against ``expect``; whether it was accepted."""
        event(f"graph write: {expect.outcome}")
        if expect.outcome == "not_found":
            with pytest.raises(batonq.TaskNotFound):
                call()
            return False
        if expect.outcome in ("accepted", "replayed"):
            reply = call()
            assert reply.outcome == expect.outcome
            if expect.state is not None:
                assert reply.state == expect.state
            return expect.outcome == "accepted"
        with pytest.raises(batonq.LeaseLost) as refused:
            call()
        cls = batonq.TaskFinished if expect.outcome == "finished" else batonq.LeaseLost
        assert type(refused.value) is cls
        assert refused.value.state == expect.state
        return False

    # -- rules ---------------------------------------------------------------
    # Few rules, each with its variants as an argument: hypothesis leaves a
    # random set of rules out of each example, and a graph needs enqueue,
    # claim and complete together to get anywhere.

    @initialize(partial=st.booleans(), backlog=st.lists(st.sampled_from([SRC, WORK]), min_size=1, max_size=3))
    def graph(self, partial: bool, backlog: list[str]) -> None:
        self.partial = partial
        self.admin.add_edge(SRC, WORK, fan_out="/items")
        self.admin.add_edge(WORK, GATHER, join=True, partial=partial)
        self.admin.add_edge(GATHER, FINAL)
        for queue in backlog:
            self.enqueue(queue, 0)

    def enqueue(self, queue: str, delay_s: int) -> None:
        self.serial += 1
        payload = {"n": self.serial}
        reply = self.client.enqueue(queue, payload, delay_s=delay_s)
        assert reply.created
        self.new_task(queue, reply, payload)

    def enqueue_debounced(self, key: str) -> None:
        self.serial += 1
        payload = {"n": self.serial}
        window = self.model.tasks.get(self.model.windows.get(key, -1))
        reply = self.client.enqueue(SRC, payload, debounce_key=key, debounce_s=DEBOUNCE_S)
        # A window is open while its task is pending and was never claimed.
        if window is not None and not window.gone and window.state == "pending" and window.fencing is None:
            event("debounce: merged")
            assert (reply.created, reply.task_id) == (False, window.id)
            window.payload = payload
            window.run_at = reply.run_at.timestamp() + self.model.aged
        else:
            assert reply.created
            self.model.windows[key] = self.new_task(SRC, reply, payload).id

    @rule(how=st.sampled_from(["src", "src", "src", "work", "src later", "debounce d0", "debounce d1"]))
    def submit(self, how: str) -> None:
        if how.startswith("debounce"):
            self.enqueue_debounced(how.split()[1])
        else:
            self.enqueue(SRC if how.startswith("src") else WORK, RETRY_DELAY_S if "later" in how else 0)

    @rule(
        pick=PICKS,
        n=st.sampled_from([1, 3]),
        then=st.sampled_from(["complete", "complete", "fail now", "fail later", "fail dead", "keep"]),
        items=st.integers(min_value=0, max_value=3),
    )
    def claim(self, pick: int, n: int, then: str, items: int) -> None:
        """Claim from a queue (mostly one with tasks ready), then complete,
        fail or keep each lease."""
        self.advance(0)
        now = self.model.now()
        ready_in = sorted({t.queue for t in self.model.live() if t.state == "pending" and t.run_at <= now})
        queues = ready_in if ready_in and pick % 4 else list(GRAPH_QUEUES)
        queue = queues[pick % len(queues)]
        self.model.expire(queue, now)
        ready = {
            t.id for t in self.model.live() if t.queue == queue and t.state == "pending" and t.run_at <= now
        }
        got = self.client.claim(queue, max_tasks=n, lease_s=LEASE_S, worker="model")
        event(f"claim: {min(len(got), 2)} of {min(len(ready), 2)}+ ready")
        assert len(got) == min(n, len(ready))
        assert {lease.task_id for lease in got} <= ready
        for lease in got:
            t = self.model.tasks[lease.task_id]
            assert lease.row == t.payload  # a join's list: its elements' results in order
            t.state, t.attempts = "leased", t.attempts + 1
            t.fencing, t.secret_live = lease.fencing_token, True
            t.lease_expires = lease.lease_expires_at.timestamp() + self.model.aged
        self.issued += got
        for lease in got:
            if then == "complete":
                self.complete_lease(lease, items)
            elif then != "keep":
                self.fail_lease(lease, then.split()[1])

    def pick_lease(self, pick: int, kind: str, live: bool) -> batonq.Lease | None:
        """Mostly a lease that may still write (``live``); else any issued."""
        leases = self.issued
        if live:
            leases = [lease for lease in leases if self.model.expect(kind, lease).outcome == "accepted"]
        if not leases:
            event("no lease to pick")
            return None
        return leases[pick % len(leases)]

    @rule(pick=PICKS, items=st.integers(min_value=0, max_value=3), live=st.sampled_from([True, False]))
    def complete(self, pick: int, items: int, live: bool) -> None:
        lease = self.pick_lease(pick, "complete", live)
        if lease is not None:
            self.complete_lease(lease, items)

    @rule(pick=PICKS, mode=st.sampled_from(["now", "later", "dead"]), live=st.sampled_from([True, False]))
    def fail(self, pick: int, mode: str, live: bool) -> None:
        lease = self.pick_lease(pick, "fail", live)
        if lease is not None:
            self.fail_lease(lease, mode)

    def complete_lease(self, lease: batonq.Lease, items: int) -> None:
        t = self.model.tasks[lease.task_id]
        result: Any = {
            SRC: {"items": list(range(self.serial + 1, self.serial + 1 + items))},
            WORK: {"w": t.payload},
            GATHER: {"g": t.id},
            FINAL: None,
        }[t.queue]
        self.serial += items
        expect = self.model.expect("complete", lease)
        if self.write(expect, lambda: self.client.complete(lease.lease_token, result)):
            event(f"complete: a task of {t.queue}")
            self.model.outcomes[(t.id, lease.fencing_token)] = ("complete", "done")
            self.model.finish(t, "done", result)
            self.hand_off(t)

    def fail_lease(self, lease: batonq.Lease, mode: str) -> None:
        t = self.model.tasks[lease.task_id]
        delay = RETRY_DELAY_S if mode == "later" else 0
        expect = self.model.expect("fail", lease)
        call = lambda: self.client.fail(  # noqa: E731
            lease.lease_token, mode, retry_delay_s=delay, requeue=mode != "dead"
        )
        if not self.write(expect, call):
            return
        if mode == "dead" or t.attempts >= GRAPH_MAX_ATTEMPTS:
            event(f"fail: dead in {t.queue}")
            self.model.finish(t, "dead")
        else:
            t.state, t.secret_live, t.lease_expires = "pending", False, None
            t.run_at = self.stored_run_at(t.id)
            assert abs(t.run_at - delay - self.model.now()) < NOW_SLACK_S
        self.model.outcomes[(t.id, lease.fencing_token)] = ("fail", t.state)

    @rule(
        action=st.sampled_from(["cancel", "hold", "release", "retry", "retry", "retry"]),
        pick=PICKS,
        fitting=st.sampled_from([True, True, False]),
    )
    def operator(self, action: str, pick: int, fitting: bool) -> None:
        """An operator's action on a task, mostly one in a state it acts on."""
        tasks = [self.model.tasks[i] for i in sorted(self.model.tasks)]
        if fitting:
            tasks = [t for t in tasks if not t.gone and t.state in ACTS_ON[action]]
        if not tasks:
            event(f"{action}: no task to pick")
            return
        t = tasks[pick % len(tasks)]
        calls: dict[str, Callable[[int], batonq.Task]] = {
            "cancel": self.admin.cancel,
            "hold": self.admin.hold,
            "release": self.admin.release,
            "retry": self.admin.retry,
        }
        retried = self.model.retry(t) if action == "retry" else None
        allowed = retried is not None if action == "retry" else t.state in ACTS_ON[action]
        if t.gone:
            event(f"{action}: a task past retention")
            with pytest.raises(batonq.TaskNotFound):
                calls[action](t.id)
            return
        event(f"{action}: {'done' if allowed else 'refused'} on a {t.state} task")
        if not allowed:
            with pytest.raises(batonq.InvalidState):
                calls[action](t.id)
            return
        task = calls[action](t.id)
        if action == "cancel":
            self.model.finish(t, "cancelled")
        elif action == "hold":
            t.state = "held"
        elif action == "release":
            t.state = "pending"
        else:
            assert retried is not None
            self.retried(t, retried)
        assert task.state == t.state

    def retried(self, t: GTask, state: str) -> None:
        t.state, t.attempts, t.secret_live, t.lease_expires, t.result = state, 0, False, None, None
        self.set_run_at_now(t)
        if t.join is not None:  # back in its join, which waits again if it died of it
            join, gather = self.model.joins[t.join], self.model.tasks[t.join]
            others_dead = any(
                self.model.tasks[e].state in ("dead", "cancelled") for e in join.elements if e != t.id
            )
            event(f"retry: an element, its join {gather.state}")
            if not join.partial and gather.state == "dead" and not others_dead:
                gather.state, gather.attempts = "waiting", 0
                self.set_run_at_now(gather)
        elements = self.model.joins[t.id].elements if state == "waiting" else []
        if state == "waiting" and all(self.model.tasks[e].state in FINISHED for e in elements):
            event("retry: a join that gathers at once")
            self.model.gather(t.id)

    @rule(how=st.sampled_from(["10 s", "40 s", "100 s", "sweep", "maintain"]))
    def clock(self, how: str) -> None:
        """Time passes (delays run out, leases expire), or the sweeper runs
        (its sweep, or its maintenance: not too often, as retention takes
        every finished task out of the operator's reach)."""
        if how == "maintain":
            self.maintain()
        elif how == "sweep":
            self.advance(0)
            assert self.client.sweep() == self.model.expire(None, self.model.now())
        else:
            self.advance(float(how.split()[0]))

    def maintain(self) -> None:
        """Retention, every finished task past it: all go but the elements
        of a join that has not gathered (seen as the pass begins)."""
        waited_for = {
            e for join in self.model.joins.values() if not (join.gone or join.gathered) for e in join.elements
        }
        self.client.maintain()
        for t in self.model.live():
            if t.state in FINISHED and t.id not in waited_for:
                t.gone = True
        for join_id, join in self.model.joins.items():
            join.gone = join.gone or self.model.tasks[join_id].gone
        # The ledger's accepted fails go too: their repeats are no replays now.
        self.model.outcomes = {k: v for k, v in self.model.outcomes.items() if v[0] == "complete"}
        self.model.windows = {
            key: task_id for key, task_id in self.model.windows.items()
            if self.model.tasks[task_id].state in UNFINISHED
        }  # fmt: skip

    # -- invariants ----------------------------------------------------------

    @invariant()
    def rows_match_model(self) -> None:
        rows = self.sql.execute(
            """SELECT id, queue, state, payload, attempts, parent_id, join_task_id, fan_index,
                      NULL::jsonb, fencing_token, lease_secret IS NOT NULL
                 FROM batonq.tasks
               UNION ALL
               SELECT id, queue, state, payload, attempts, parent_id, join_task_id, fan_index,
                      result, fencing_token, NULL
                 FROM batonq.archive"""
        ).fetchall()
        assert len(rows) == len({row[0] for row in rows}), "a task is in exactly one place"
        got = {row[0]: row[1:] for row in rows}
        assert got == {
            t.id: (t.queue, t.state, t.payload, t.attempts, t.parent, t.join, t.index,
                   t.result if t.state == "done" else None, t.fencing,
                   t.secret_live if t.state in UNFINISHED else None)
            for t in self.model.live()
        }  # fmt: skip
        returned = [i for i in self.model.ever_done if got.get(i, ("", "done"))[1] != "done"]
        assert not returned, "a done task never comes back"

    @invariant()
    def joins_match_model(self) -> None:
        rows = self.sql.execute(
            "SELECT join_task_id, expected, finished, partial, resolved FROM batonq.joins"
        ).fetchall()
        assert {row[0]: row[1:] for row in rows} == {
            join_id: (
                len(join.elements),
                sum(self.model.tasks[e].state in FINISHED for e in join.elements),
                join.partial,
                join.gathered,
            )
            for join_id, join in self.model.joins.items()
            if not join.gone
        }

    @invariant()
    def counts_match(self) -> None:
        self.advance(0)
        now = self.model.now()
        for stats in self.client.queues():
            got = {name: getattr(stats, name) for name in (*UNFINISHED, "scheduled", *FINISHED)}
            assert got == self.model.counts(stats.queue, now), stats.queue


def test_graph_matches_model(
    client: batonq.Client, admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    class OnThisDatabase(GraphMachine):
        def __init__(self) -> None:
            super().__init__(client, admin, sql)

    run_state_machine_as_test(
        OnThisDatabase,
        settings=settings(
            max_examples=examples(10),
            stateful_step_count=40,
            deadline=None,
            phases=(Phase.explicit, Phase.reuse, Phase.generate),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
