"""Group-limited claims against a pure-Python model of docs/flow-control.md's
rule: a claim takes the queue's claimable tasks in claim order (priority,
then run_at, then id), skipping a grouped task while its group holds
``group_max_leased`` leases (counting the ones this claim took), up to
``max_tasks``.

A hypothesis state machine drives random enqueues into a few groups,
claims, completes, fails (retried at once, or dead), releases, expiries,
the operator's hold, release and cancel, and changes of the limit. Before
each claim the model lists the queue's pending tasks in claim order (the
engine's own order, read from its table) and picks by the rule with its own
count of each group's leases; the claim must return exactly those tasks. So
a task the engine set aside while its group was full (group_full) comes back
as soon as its group has room, and never before."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from tests.integration.test_model import EMPTY, examples

import batonq

Q = "model:groups"
GROUPS = st.sampled_from(["a", "a", "b", "c", None])


@dataclass
class GroupModel:
    limit: int
    # task id -> (group, state); leased tasks also have their lease token
    tasks: dict[int, tuple[str | None, str]] = field(default_factory=dict)
    tokens: dict[int, str] = field(default_factory=dict)

    def leased_in(self, group: str) -> int:
        return sum(1 for g, s in self.tasks.values() if g == group and s == "leased")

    def in_state(self, state: str) -> list[int]:
        return sorted(t for t, (_, s) in self.tasks.items() if s == state)


class GroupMachine(RuleBasedStateMachine):
    def __init__(self, admin: batonq.Client, sql: psycopg.Connection[Any]) -> None:
        super().__init__()
        self.admin = admin
        self.sql = sql
        sql.execute(EMPTY)
        sql.execute("DELETE FROM batonq.group_leases; DELETE FROM batonq.group_lease_deltas")
        admin.configure_queue(Q, group_max_leased=2, max_attempts=5)
        self.model = GroupModel(limit=2)

    def pick(self, state: str, index: int) -> int | None:
        found = self.model.in_state(state)
        return found[index % len(found)] if found else None

    @rule(groups=st.lists(GROUPS, min_size=1, max_size=4), priority=st.sampled_from([0, 0, 1]))
    def enqueue(self, groups: list[str | None], priority: int) -> None:
        made = self.admin.enqueue_many(
            Q, [{}] * len(groups), groups=groups, priorities=[priority] * len(groups)
        )
        for task, group in zip(made, groups, strict=True):
            self.model.tasks[task.task_id] = (group, "pending")

    @rule(n=st.integers(1, 5))
    def claim(self, n: int) -> None:
        in_order = self.sql.execute(
            "SELECT id, group_key FROM batonq.tasks WHERE queue = %s AND state = 'pending'"
            " ORDER BY priority DESC, run_at, id",
            (Q,),
        ).fetchall()
        took: dict[str, int] = {}
        expected = []
        for task, group in in_order:
            if len(expected) == n:
                break
            if group is not None:
                if self.model.leased_in(group) + took.get(group, 0) >= self.model.limit:
                    continue
                took[group] = took.get(group, 0) + 1
            expected.append(task)
        leases = self.admin.claim(Q, max_tasks=n, lease_s=300)
        assert [lease.task_id for lease in leases] == expected
        for lease in leases:
            self.model.tasks[lease.task_id] = (self.model.tasks[lease.task_id][0], "leased")
            self.model.tokens[lease.task_id] = lease.lease_token

    def end_lease(self, index: int, state: str | None) -> tuple[int, str] | None:
        task = self.pick("leased", index)
        if task is None:
            return None
        group, _ = self.model.tasks[task]
        if state is None:
            del self.model.tasks[task]
        else:
            self.model.tasks[task] = (group, state)
        return task, self.model.tokens.pop(task)

    @rule(index=st.integers(0, 20))
    def complete(self, index: int) -> None:
        if ended := self.end_lease(index, None):
            assert self.admin.complete(ended[1]).outcome == "accepted"

    @rule(index=st.integers(0, 20), requeue=st.booleans())
    def fail(self, index: int, requeue: bool) -> None:
        if ended := self.end_lease(index, "pending" if requeue else None):
            reply = self.admin.fail(ended[1], "boom", retry_delay_s=0, requeue=requeue)
            assert (reply.outcome, reply.state) == ("accepted", "pending" if requeue else "dead")

    @rule(index=st.integers(0, 20))
    def release_lease(self, index: int) -> None:
        if ended := self.end_lease(index, "pending"):
            assert self.admin.release_lease(ended[1]).outcome == "accepted"

    @rule(index=st.integers(0, 20))
    def expire(self, index: int) -> None:
        if ended := self.end_lease(index, "pending"):
            self.sql.execute(
                "UPDATE batonq.tasks SET lease_expires_at = now() - interval '1 s' WHERE id = %s", (ended[0],)
            )
            assert self.sql.execute("SELECT batonq.expire_leases(%s)", (Q,)).fetchone() == (1,)

    @rule(index=st.integers(0, 20))
    def hold(self, index: int) -> None:
        if (task := self.pick("pending", index)) is not None:
            self.admin.hold(task)
            self.model.tasks[task] = (self.model.tasks[task][0], "held")

    @rule(index=st.integers(0, 20))
    def release_held(self, index: int) -> None:
        if (task := self.pick("held", index)) is not None:
            self.admin.release(task)
            self.model.tasks[task] = (self.model.tasks[task][0], "pending")

    @rule(index=st.integers(0, 20), state=st.sampled_from(["pending", "held"]))
    def cancel(self, index: int, state: str) -> None:
        if (task := self.pick(state, index)) is not None:
            self.admin.cancel(task)
            del self.model.tasks[task]

    @rule(limit=st.integers(1, 3))
    def set_limit(self, limit: int) -> None:
        self.admin.configure_queue(Q, group_max_leased=limit)
        self.model.limit = limit

    @invariant()
    def states_are_the_models(self) -> None:
        rows = self.sql.execute(
            "SELECT id, group_key, state, group_full FROM batonq.tasks WHERE queue = %s", (Q,)
        ).fetchall()
        assert {t: (g, s) for t, g, s, _ in rows} == self.model.tasks
        assert all(s == "pending" for _, _, s, full in rows if full), "set aside but not pending"


def test_group_limited_claims_match_the_model(admin: batonq.Client, sql: psycopg.Connection[Any]) -> None:
    class OnThisDatabase(GroupMachine):
        def __init__(self) -> None:
            super().__init__(admin, sql)

    run_state_machine_as_test(
        OnThisDatabase,
        settings=settings(
            max_examples=examples(40),
            stateful_step_count=50,
            deadline=None,
            phases=(Phase.explicit, Phase.reuse, Phase.generate),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
