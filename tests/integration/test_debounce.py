"""Debounced enqueue: a stream of enqueues of one key collapses into the
tasks it should, each run once with the payload it should carry."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from tests.waiting import wait_for

import batonq

WINDOW_S = 0.5


def _stream(
    client: batonq.Client, n: int, over_s: float, **debounce: Any
) -> tuple[dict[int, list[int]], float]:
    """Enqueue payloads 0..n-1 of one key, evenly over ``over_s`` (or as
    fast as they go); the sequence numbers each task collected, by task id,
    and how long the stream took."""
    collected: dict[int, list[int]] = {}
    start = time.monotonic()
    for seq in range(n):
        pause = start + seq * over_s / n - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the stream, not waiting for a result
        reply = client.enqueue("digest", {"seq": seq}, debounce_key="user-7", debounce_s=WINDOW_S, **debounce)
        collected.setdefault(reply.task_id, []).append(seq)
    return collected, time.monotonic() - start


def _work(dsn: str, stop: threading.Event, runs: list[batonq.Lease]) -> None:
    with batonq.connect(dsn, poll_interval_s=0.05) as worker:
        while not stop.is_set():
            for lease in worker.claim("digest", wait_s=0.2):
                runs.append(lease)
                worker.complete(lease.lease_token)


def _run_stream(
    client: batonq.Client, dsn: str, **debounce: Any
) -> tuple[dict[int, list[int]], list[batonq.Lease], float]:
    runs: list[batonq.Lease] = []
    stop = threading.Event()
    worker = threading.Thread(target=_work, args=(dsn, stop, runs))
    worker.start()
    try:
        collected, took_s = _stream(client, 1000, 2.0, **debounce)
        wait_for(lambda: len(runs) >= len(collected), timeout=30, what="every task run")
    finally:
        stop.set()
        worker.join()
    return collected, runs, took_s


@pytest.mark.parametrize("keep", ["last", "first"])
def test_a_steady_stream_runs_once_after_its_window(client: batonq.Client, dsn: str, keep: str) -> None:
    collected, runs, _ = _run_stream(client, dsn, keep=keep)
    # Milliseconds apart, far inside the 0.5 s window: one task, run once.
    assert len(collected) == 1
    [(task_id, seqs)] = collected.items()
    assert seqs == list(range(1000))
    [run] = runs
    assert run.task_id == task_id
    assert run.row == {"seq": 999 if keep == "last" else 0}
    task = client.task(task_id)
    assert task.state == "done" and task.attempts == 1
    assert task.claimed_at is not None and task.claimed_at >= task.run_at


def test_max_wait_runs_a_steady_stream_every_so_often(client: batonq.Client, dsn: str) -> None:
    collected, runs, took_s = _run_stream(client, dsn, max_wait_s=0.6)
    # A window closes 0.6 s after it opened however busy the key, and the
    # next opens with the first enqueue after its task was claimed (the
    # worker polls every 0.05 s): one window per 0.6-0.9 s of stream.
    assert took_s / 0.9 <= len(collected) <= took_s / 0.6 + 1
    assert sorted(r.task_id for r in runs) == sorted(collected)  # each task ran, once
    for run in runs:
        assert run.row == {"seq": collected[run.task_id][-1]}  # the last payload of its window
    assert sorted(seq for seqs in collected.values() for seq in seqs) == list(range(1000))


def test_debounce_keys_and_idempotency_keys_never_meet(client: batonq.Client) -> None:
    plain = client.enqueue("digest", {"n": 1}, idempotency_key="user-7")
    debounced = client.enqueue("digest", {"n": 2}, debounce_key="user-7", debounce_s=60)
    assert debounced.created and debounced.task_id != plain.task_id


def test_bad_debounce_arguments_are_refused(client: batonq.Client) -> None:
    with pytest.raises(batonq.InvalidArgument, match="max_wait_s must be at least debounce_s"):
        client.enqueue("digest", {}, debounce_key="k", debounce_s=5, max_wait_s=1)
    with pytest.raises(batonq.InvalidArgument, match="keep must be first or last"):
        client.enqueue("digest", {}, debounce_key="k", debounce_s=5, keep="middle")
    with pytest.raises(batonq.InvalidArgument, match="needs both"):
        client.enqueue("digest", {}, debounce_s=5)


def test_a_claimed_task_closes_its_window(client: batonq.Client) -> None:
    first = client.enqueue("digest", {"n": 1}, debounce_key="k", debounce_s=0.01)
    [lease] = client.claim("digest", wait_s=5)
    client.fail(lease.lease_token, "later", retry_delay_s=30)
    # Pending again, waiting for its retry: claimed once, so its window is shut.
    again = client.enqueue("digest", {"n": 2}, debounce_key="k", debounce_s=1)
    assert again.created and again.task_id != first.task_id
    retrying = client.task(first.task_id)
    assert retrying.payload == {"n": 1}
    assert retrying.run_at > again.run_at  # still its 30 s retry delay
