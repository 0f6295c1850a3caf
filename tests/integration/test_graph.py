"""The queue graph: batons, map/when/fan_out, joins, cycles and lineage."""

from __future__ import annotations

import random
import re
from typing import Any

import psycopg
import pytest
from tests.conftest import age

import batonq


def drain(client: batonq.Client, queue: str, handler: Any, *, batch: int = 50) -> int:
    """Claim and complete everything in ``queue``; returns how many."""
    n = 0
    while leases := client.claim(queue, max_tasks=batch):
        client.complete_many([(lease.lease_token, handler(lease.row)) for lease in leases])
        n += len(leases)
    return n


def test_three_step_pipeline_exactly_once(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    admin.add_edge("retrieve", "rank", map="/docs")
    admin.add_edge("rank", "summarise")
    runs = 500
    roots = client.enqueue_many(
        "retrieve", [{"q": i} for i in range(runs)], idempotency_keys=[f"run-{i}" for i in range(runs)]
    )
    rng = random.Random(7)
    died: set[int] = set()

    def step(queue: str, handler: Any) -> None:
        while leases := client.claim(queue, max_tasks=25, lease_s=30):
            # A worker dies mid-step for some tasks (once each, so none runs
            # out of attempts): their leases run out and they are claimed again.
            dying = [lease for lease in leases if lease.task_id not in died and rng.random() < 0.2]
            died.update(lease.task_id for lease in dying)
            living = [lease for lease in leases if lease not in dying]
            items = [(lease.lease_token, handler(lease.row)) for lease in living]
            # Every completion is sent twice: once in a batch, once alone.
            client.complete_many(items)
            for token, result in items:
                assert client.complete(token, result).replayed
            if dying:
                age(sql, 31)

    step("retrieve", lambda p: {"docs": [p["q"], p["q"] + 1]})
    step("rank", lambda p: sorted(p, reverse=True))
    step("summarise", lambda p: {"top": p[0]})

    counts = sql.execute(
        """SELECT queue, count(*), count(DISTINCT root_id) FROM batonq.archive
            WHERE state = 'done' GROUP BY queue ORDER BY queue"""
    ).fetchall()
    assert counts == [("rank", runs, runs), ("retrieve", runs, runs), ("summarise", runs, runs)]
    assert len(died) > 100
    assert sql.execute("SELECT count(*) FROM batonq.tasks").fetchone() == (0,)
    one = roots[3].task_id
    tree = client.run_tasks(one)
    assert [t.queue for t in tree] == ["retrieve", "rank", "summarise"]
    assert tree[2].result == {"top": 4} and tree[1].parent_id == one and tree[2].parent_id == tree[1].id
    assert client.run_status(one).status == "done"


def test_fan_out_into_join_fires_once_in_order(admin: batonq.Client, client: batonq.Client) -> None:
    admin.add_edge("split", "work", fan_out="/items", map="/n")
    admin.add_edge("work", "gather", join=True)
    root = client.enqueue("split", {"size": 100})
    [lease] = client.claim("split")
    client.complete(lease.lease_token, {"items": [{"n": i} for i in range(100)]})

    [waiting] = client.tasks("gather")
    assert waiting.state == "waiting" and waiting.parent_id == root.task_id
    # Complete the elements out of order, in several transactions.
    leases = client.claim("work", max_tasks=100)
    assert sorted(lease.row for lease in leases) == list(range(100))
    random.Random(1).shuffle(leases)
    for chunk in range(0, 100, 30):
        part = leases[chunk : chunk + 30]
        client.complete_many([(lease.lease_token, lease.row * 10) for lease in part])
        if chunk + 30 < 100:
            assert client.task(waiting.id).state == "waiting"
    [joined] = client.claim("gather")
    assert joined.task_id == waiting.id
    assert joined.row == [i * 10 for i in range(100)]
    assert client.claim("gather") == []
    client.complete(joined.lease_token, {"sum": sum(joined.row)})
    status = client.run_status(root.task_id)
    assert (status.status, status.tasks, status.done) == ("done", 102, 102)


def test_dead_element_kills_the_join(admin: batonq.Client, client: batonq.Client) -> None:
    admin.add_edge("split", "work", fan_out="")
    admin.add_edge("work", "gather", join=True)
    root = client.enqueue("split", None)
    [lease] = client.claim("split")
    client.complete(lease.lease_token, [1, 2, 3])
    leases = {lease.row: lease for lease in client.claim("work", max_tasks=3)}
    client.complete(leases[1].lease_token, "one")
    client.fail(leases[2].lease_token, "element two broke", requeue=False)
    client.complete(leases[3].lease_token, "three")
    [join] = client.tasks("gather")
    assert join.state == "dead"
    assert join.last_error == f"fan-out element t_{leases[2].task_id} is dead: element two broke"
    assert client.claim("gather") == []
    status = client.run_status(root.task_id)
    assert status.status == "failed"
    assert (status.failed_task_id, status.error) == (leases[2].task_id, "element two broke")


def test_partial_join_passes_nulls(admin: batonq.Client, client: batonq.Client) -> None:
    admin.add_edge("split", "work", fan_out="/xs")
    admin.add_edge("work", "gather", join=True, partial=True)
    client.enqueue("split", None)
    [lease] = client.claim("split")
    client.complete(lease.lease_token, {"xs": ["a", "b"]})
    a, b = sorted(client.claim("work", max_tasks=2), key=lambda lease: lease.row)
    client.fail(b.lease_token, "nope", requeue=False)
    client.complete(a.lease_token, "A")
    [joined] = client.claim("gather")
    assert joined.row == ["A", None]


def test_empty_fan_out_makes_a_ready_join(admin: batonq.Client, client: batonq.Client) -> None:
    admin.add_edge("split", "work", fan_out="/xs")
    admin.add_edge("work", "gather", join=True)
    client.enqueue("split", None)
    [lease] = client.claim("split")
    client.complete(lease.lease_token, {"xs": []})
    [joined] = client.claim("gather")
    assert joined.row == []


def test_when_routes_each_result_down_one_branch(admin: batonq.Client, client: batonq.Client) -> None:
    admin.add_edge("classify", "spam", when="/label", equals="spam")
    admin.add_edge("classify", "inbox", when="/label", equals="ham")
    admin.add_edge("classify", "review", when="/doubt", present=True)
    labels = ["spam", "ham", "ham", "spam", "ham"]
    client.enqueue_many("classify", list(range(len(labels))))
    leases = client.claim("classify", max_tasks=10)
    client.complete_many(
        [
            (lease.lease_token, {"label": labels[lease.row], "n": lease.row}
             | ({"doubt": 1} if lease.row == 4 else {}))
            for lease in leases
        ]
    )  # fmt: skip
    assert sorted(t.payload["n"] for t in client.tasks("spam")) == [0, 3]
    assert sorted(t.payload["n"] for t in client.tasks("inbox")) == [1, 2, 4]
    assert [t.payload["n"] for t in client.tasks("review")] == [4]


def test_cycle_refused_with_the_cycle_named(admin: batonq.Client) -> None:
    admin.add_edge("a", "b")
    admin.add_edge("b", "c")
    with pytest.raises(
        batonq.GraphCycle, match=re.escape("edge c -> a would close a cycle: c -> a -> b -> c")
    ) as refused:
        admin.add_edge("c", "a")
    assert refused.value.detail["cycle"][0] == "c"
    with pytest.raises(batonq.GraphCycle):
        admin.add_edge("a", "a")
    assert [(e.from_queue, e.to_queue) for e in admin.edges()] == [("a", "b"), ("b", "c")]


def test_removing_an_edge_stops_new_batons_only(admin: batonq.Client, client: batonq.Client) -> None:
    admin.add_edge("a", "b")
    client.enqueue_many("a", [1, 2])
    first, second = client.claim("a", max_tasks=2)
    client.complete(first.lease_token, "x")
    assert len(client.tasks("b")) == 1
    assert admin.remove_edge("a", "b") is True
    assert admin.remove_edge("a", "b") is False
    client.complete(second.lease_token, "y")
    [in_flight] = client.tasks("b")
    [lease] = client.claim("b")
    assert lease.task_id == in_flight.id and lease.row == "x"


def test_edge_priority_and_delay(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    admin.add_edge("a", "b")
    admin.add_edge("a", "c", priority=9, delay_s=60)
    client.enqueue("a", 1, priority=4)
    [lease] = client.claim("a")
    client.complete(lease.lease_token, 2)
    [b] = client.claim("b")
    assert b.priority == 4
    assert client.claim("c") == []
    age(sql, 61)
    [c] = client.claim("c")
    assert c.priority == 9


def test_lineage_with_fan_out_and_explicit_children(admin: batonq.Client, client: batonq.Client) -> None:
    admin.add_edge("plan", "step", fan_out="/steps")
    root = client.enqueue("plan", "do it")
    [lease] = client.claim("plan")
    child = client.enqueue("notes", "explicit child", parent=lease.task_id)
    client.complete(lease.lease_token, {"steps": ["s1", "s2"]})
    [step] = client.claim("step")
    grandchild = client.enqueue("notes", "from a step", parent=f"t_{step.task_id}")
    tree = client.run_tasks(root.task_id)
    assert {t.id for t in tree} == {root.task_id, child.task_id, grandchild.task_id} | {
        t.id for t in client.tasks("step")
    }
    assert len(tree) == 5
    parents = {t.id: t.parent_id for t in tree}
    assert parents[grandchild.task_id] == step.task_id and parents[step.task_id] == root.task_id
    assert all(t.root_id == root.task_id for t in tree)
    assert client.run_status(root.task_id).status == "running"
    with pytest.raises(batonq.TaskNotFound):
        client.enqueue("notes", 1, parent=10**12)


@pytest.mark.parametrize("edge", ["plain", "fan_out", "join"])
def test_an_enqueue_cannot_take_a_batons_place(
    admin: batonq.Client, client: batonq.Client, sql: psycopg.Connection[Any], edge: str
) -> None:
    # A key scoped to the target queue enqueues, first, under every name a
    # baton could once have had (baton:<parent>:<edge>:<index>).
    options: dict[str, Any] = {"plain": {}, "fan_out": {"fan_out": "/items"}, "join": {"join": True}}[edge]
    admin.add_edge("hj-a", "hj-b", **options)
    edge_id = sql.execute("SELECT id FROM batonq.edges WHERE from_queue = 'hj-a'").fetchone()
    assert edge_id is not None
    parent = client.enqueue("hj-a", {"n": 1})
    for index in range(2):
        forged_key = f"baton:{parent.task_id}:{edge_id[0]}:{index}"
        forged = client.enqueue("hj-b", {"forged": True}, idempotency_key=forged_key)
        assert forged.created
    [lease] = client.claim("hj-a")
    result = {"items": [{"real": 0}, {"real": 1}]}
    client.complete(lease.lease_token, result)

    made = sorted((t for t in client.tasks("hj-b") if t.parent_id == parent.task_id), key=lambda t: t.id)
    expected = {"plain": [result], "fan_out": result["items"], "join": [[result]]}[edge]
    assert [t.payload for t in made] == expected
    assert all(t.idempotency_key is None for t in made)
    forged_left = [t for t in client.tasks("hj-b") if t.payload == {"forged": True}]
    assert len(forged_left) == 2 and all(t.parent_id is None for t in forged_left)
    assert client.run_status(parent.task_id).tasks == 1 + len(expected)


def fan_out_three(admin: batonq.Client, client: batonq.Client, *, partial: bool) -> dict[int, batonq.Lease]:
    """split fans [1, 2, 3] out into work, joined into gather; the three
    leases of work, by their element."""
    admin.add_edge("split", "work", fan_out="")
    admin.add_edge("work", "gather", join=True, partial=partial)
    client.enqueue("split", None)
    [lease] = client.claim("split")
    client.complete(lease.lease_token, [1, 2, 3])
    return {lease.row: lease for lease in client.claim("work", max_tasks=3)}


def test_a_retried_element_keeps_its_place_in_the_join(admin: batonq.Client, client: batonq.Client) -> None:
    leases = fan_out_three(admin, client, partial=True)
    client.fail(leases[1].lease_token, "broke", requeue=False)
    assert admin.retry(leases[1].task_id).state == "pending"
    [again] = client.claim("work")
    client.complete(again.lease_token, 10)
    client.complete(leases[2].lease_token, 20)
    assert client.claim("gather") == []  # the third is still leased
    client.complete(leases[3].lease_token, 30)
    [joined] = client.claim("gather")
    assert joined.row == [10, 20, 30]
    assert len(client.tasks("gather")) == 1


def test_retrying_the_element_a_join_died_of_brings_the_join_back(
    admin: batonq.Client, client: batonq.Client
) -> None:
    leases = fan_out_three(admin, client, partial=False)
    root = leases[1].root_id
    client.fail(leases[2].lease_token, "broke", requeue=False)
    client.complete(leases[1].lease_token, 10)
    client.complete(leases[3].lease_token, 30)
    [join] = client.tasks("gather")
    assert join.state == "dead"
    # The join cannot run while its element is dead: retry the element.
    with pytest.raises(batonq.InvalidState, match=f"its element t_{leases[2].task_id} is dead"):
        admin.retry(join.id)

    admin.retry(leases[2].task_id)
    assert client.task(join.id).state == "waiting"
    assert client.run_status(root).status == "running"
    [again] = client.claim("work")
    client.complete(again.lease_token, 20)
    [joined] = client.claim("gather")
    assert (joined.task_id, joined.row) == (join.id, [10, 20, 30])
    client.complete(joined.lease_token, "all")
    assert client.run_status(root).status == "done"


def test_an_element_whose_join_gathered_without_it_is_not_retried(
    admin: batonq.Client, client: batonq.Client
) -> None:
    leases = fan_out_three(admin, client, partial=True)
    client.fail(leases[1].lease_token, "broke", requeue=False)
    client.complete(leases[2].lease_token, 20)
    client.complete(leases[3].lease_token, 30)
    [joined] = client.claim("gather")
    assert joined.row == [None, 20, 30]
    with pytest.raises(batonq.InvalidState, match=f"its join t_{joined.task_id} has gathered"):
        admin.retry(leases[1].task_id)
    assert client.task(leases[1].task_id).state == "dead"


def test_a_cancelled_join_retried_gathers_its_elements(admin: batonq.Client, client: batonq.Client) -> None:
    leases = fan_out_three(admin, client, partial=False)
    [join] = client.tasks("gather")
    admin.cancel(join.id)
    for n, lease in leases.items():
        client.complete(lease.lease_token, n * 10)
    assert client.task(join.id).state == "cancelled"
    assert admin.retry(join.id).state == "pending"
    [joined] = client.claim("gather")
    assert joined.row == [10, 20, 30]
