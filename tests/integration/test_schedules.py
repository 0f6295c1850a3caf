"""Cron schedules: settings, audit, and each tick fired exactly once by
competing sweeper processes, one of them killed, and across an outage."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from tests.proc_worker import Worker
from tests.waiting import wait_for

import batonq

EVERY_SECOND = "* * * * * *"


def _ticks(sql: psycopg.Connection[Any], schedule: str) -> list[tuple[datetime, int, bool]]:
    return sql.execute(
        "SELECT tick, task_id, catch_up FROM batonq.schedule_firings WHERE schedule = %s ORDER BY tick",
        (schedule,),
    ).fetchall()


def _seconds(start: datetime, end: datetime) -> list[datetime]:
    """Every whole second from ``start`` to ``end``, both included."""
    out, tick = [], start
    while tick <= end:
        out.append(tick)
        tick += timedelta(seconds=1)
    return out


def test_add_list_pause_resume_remove_and_audit(admin: batonq.Client) -> None:
    made = admin.add_schedule("nightly", "30 2 * * *", "reports", {"kind": "daily"}, tz="Europe/Berlin")
    assert (made.cron, made.tz, made.queue, made.payload, made.missed, made.paused) == (
        "30 2 * * *", "Europe/Berlin", "reports", {"kind": "daily"}, "fire-once", False,
    )  # fmt: skip
    assert [s.name for s in admin.schedules()] == ["nightly"]
    assert admin.pause_schedule("nightly", actor="key:7").paused
    assert not admin.resume_schedule("nightly").paused
    assert admin.remove_schedule("nightly")
    assert not admin.remove_schedule("nightly")
    with pytest.raises(batonq.ScheduleNotFound):
        admin.pause_schedule("nightly")

    audit = admin.settings_audit(kind="schedule", name="nightly")
    assert [(e.before is None, e.after is None) for e in reversed(audit)] == [
        (True, False), (False, False), (False, False), (False, True),
    ]  # fmt: skip
    paused = audit[2]
    assert paused.actor == "key:7" and paused.before and paused.after
    assert (paused.before["paused"], paused.after["paused"]) == (False, True)
    assert audit[0].actor == "postgres"  # the database role, when no key is named


def test_a_page_of_queues_reads_its_own_settings_and_schedules(admin: batonq.Client) -> None:
    for queue in ("page:a", "page:b", "page:c"):
        admin.configure_queue(queue, lease_s=60)
        admin.add_schedule(f"for-{queue}", "0 * * * *", queue, {})
    page = ["page:c", "page:a", "page:none"]
    assert [c.name for c in admin.queue_configs(page)] == ["page:a", "page:c"]
    assert [s.name for s in admin.schedules(page)] == ["for-page:a", "for-page:c"]
    assert admin.queue_configs([]) == admin.schedules([]) == []
    assert {c.name for c in admin.queue_configs()} >= {"page:a", "page:b", "page:c"}
    assert len(admin.schedules()) == 3
    one = admin.schedule("for-page:b")
    assert one is not None and (one.name, one.queue) == ("for-page:b", "page:b")
    assert admin.schedule("for-page:none") is None


def test_queue_settings_changes_are_audited_with_who(admin: batonq.Client) -> None:
    admin.configure_queue("shop", lease_s=60)
    admin.pause("shop", actor="key:3")
    newest, older = admin.settings_audit(kind="queue", name="shop", limit=2)
    assert newest.actor == "key:3" and newest.before and newest.after
    assert (newest.before["paused"], newest.after["paused"]) == (False, True)
    assert older.after and older.after["lease_s"] == 60
    # A schedule's new queue is made by the one who adds the schedule.
    admin.add_schedule("for-new", "0 * * * *", "shop:new", actor="key:4")
    [made] = admin.settings_audit(kind="queue", name="shop:new")
    assert (made.actor, made.before) == ("key:4", None)
    with pytest.raises(batonq.InvalidQueueName):
        admin.add_schedule("bad-queue", "0 * * * *", "Not A Queue")


@pytest.mark.parametrize(
    ("cron", "tz", "message"),
    [
        ("every minute", "UTC", "invalid cron expression"),
        ("* * * * * * *", "UTC", "use five fields .* or six with seconds first"),
        ("* * * * *", "Mars/Olympus", "unknown time zone"),
        ("0 0 30 2 *", "UTC", "never fires"),  # 30 February
    ],
)
def test_bad_cron_or_time_zone_is_refused(admin: batonq.Client, cron: str, tz: str, message: str) -> None:
    with pytest.raises(batonq.InvalidArgument, match=message):
        admin.add_schedule("bad", cron, "q", tz=tz)
    assert admin.schedules() == []


def test_a_tick_the_queue_refuses_is_skipped_and_the_other_schedules_fire(
    admin: batonq.Client, admin_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A schedule whose payload its queue refuses (its limit lowered after
    the schedule was added) loses that tick; it does not stop the firer."""
    admin.add_schedule("too-big", EVERY_SECOND, "ticks:small", payload={"text": "x" * 500})
    admin.configure_queue("ticks:small", max_body_bytes=100)
    admin.add_schedule("fine", EVERY_SECOND, "ticks:fine")
    sweeper = batonq.Sweeper(admin_dsn, interval_s=0.2)
    sweeper.start()
    try:
        wait_for(lambda: len(admin.tasks("ticks:fine")) >= 3, timeout=20, what="three ticks of 'fine'")
        skipped = "schedule too-big did not fire its tick"
        wait_for(lambda: skipped in caplog.text, timeout=10, what="the skip logged")
    finally:
        sweeper.stop()
    assert admin.tasks("ticks:small") == []
    [too_big] = [s for s in admin.schedules() if s.name == "too-big"]
    moved_on = datetime.now().astimezone() - timedelta(seconds=5)
    assert too_big.next_tick is not None and too_big.next_tick > moved_on


def test_a_repeated_firing_call_enqueues_nothing_more(
    admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    admin.add_schedule("twice", EVERY_SECOND, "ticks")
    sql.execute("UPDATE batonq.schedules SET armed_at = now() - interval '10 s' WHERE name = 'twice'")
    due = sql.execute("SELECT * FROM batonq.due_schedules()").fetchone()
    assert due is not None
    name, _, _, armed_at, next_tick, now = due
    tick = now.replace(microsecond=0)
    call = "SELECT batonq.fire_schedule(%s, %s, %s, NULL, ARRAY[%s]::timestamptz[], %s)"
    args = (name, armed_at, next_tick, tick, tick + timedelta(seconds=1))
    assert sql.execute(call, args).fetchone() == (1,)
    assert sql.execute(call, args).fetchone() == (0,)  # a lost reply's retry, or a second firer
    assert len(admin.tasks("ticks")) == 1


def test_each_tick_fires_once_across_three_processes_one_killed(
    dsn: str, admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    firers = [Worker("sweep", dsn, "0.25", "3") for _ in range(3)]
    try:
        for firer in firers:
            assert firer.read_line(30) == "ready"
        leader = wait_for(lambda: _leader(firers), timeout=30, what="a leader")
        admin.add_schedule("pulse", EVERY_SECOND, "pulses", {"beat": True})
        time.sleep(15)  # the run itself: half of the 30 s
        assert leader.sigkill() != 0
        others = [f for f in firers if f is not leader]
        standby = wait_for(lambda: _leader(others), timeout=30, what="a new leader")
        time.sleep(15)
        standby.sigkill()
    finally:
        for firer in firers:
            firer.close()

    fired = _ticks(sql, "pulse")
    ticks = [tick for tick, _, _ in fired]
    assert len(ticks) >= 25
    # Every second from the first tick to the last, once each: the takeover
    # lost none and fired none twice, and none counted as missed.
    assert ticks == _seconds(ticks[0], ticks[-1])
    assert not any(catch_up for _, _, catch_up in fired)
    tasks = admin.tasks("pulses", limit=1000)
    assert sorted(t.id for t in tasks) == sorted(task_id for _, task_id, _ in fired)
    assert {str(t.payload) for t in tasks} == {"{'beat': True}"}


def _leader(firers: Iterable[Worker]) -> Worker | None:
    """The firer that printed "leader", if one has (without waiting)."""
    for firer in firers:
        try:
            if firer.read_line(0.01) == "leader":
                return firer
        except AssertionError:
            continue
    return None


@pytest.mark.parametrize("missed", ["fire-once", "skip"])
def test_an_outage_honours_the_missed_tick_setting(
    dsn: str, admin: batonq.Client, sql: psycopg.Connection[Any], missed: str
) -> None:
    with Worker("sweep", dsn, "0.25", "1") as first:
        assert first.read_line(30) == "ready"
        assert first.read_line(30) == "leader"
        admin.add_schedule("beat", EVERY_SECOND, "beats", missed=missed)
        wait_for(lambda: _ticks(sql, "beat"), timeout=30, what="a first firing")
        time.sleep(2)
        first.sigkill()
    (down_at,) = sql.execute("SELECT now()").fetchone() or ()
    time.sleep(5)  # the outage
    with Worker("sweep", dsn, "0.25", "1") as second:
        assert second.read_line(30) == "ready"
        (up_at,) = sql.execute("SELECT now()").fetchone() or ()
        back = up_at + timedelta(seconds=2)
        wait_for(lambda: _ticks(sql, "beat")[-1][0] > back, timeout=30, what="ticks again")
        second.sigkill()

    fired = _ticks(sql, "beat")
    ticks = [tick for tick, _, _ in fired]
    assert len(ticks) == len(set(ticks))
    # Ticks surely missed: after the last fired before the kill, and over a
    # second older than the restart (the grace the firer was given).
    lost = [t for t in _seconds(ticks[0], ticks[-1]) if down_at < t < up_at - timedelta(seconds=2)]
    assert len(lost) >= 2
    caught_up = [tick for tick, _, catch_up in fired if catch_up]
    assert not set(lost) & set(ticks) - set(caught_up)
    if missed == "fire-once":
        # One task on behalf of the ticks missed in the outage.
        assert len(caught_up) == 1
        assert down_at < caught_up[0] < up_at
    else:
        assert caught_up == []
    # Outside the outage, every second fired.
    assert set(_seconds(ticks[0], down_at.replace(microsecond=0) - timedelta(seconds=1))) <= set(ticks)
    last = ticks[-1]
    assert set(_seconds(up_at.replace(microsecond=0) + timedelta(seconds=1), last)) <= set(ticks)


NIGHTLY = 10_000


def _nightly_customers(admin: batonq.Client, sql: psycopg.Connection[Any], in_s: int) -> datetime:
    """NIGHTLY schedules (a nightly job per customer) that share one tick,
    ``in_s`` seconds from now, as added one by one would be; the tick."""
    admin.configure_queue("nightly", lease_s=60)
    (now,) = sql.execute("SELECT date_trunc('second', now())").fetchone() or ()
    tick = now.astimezone(UTC) + timedelta(seconds=in_s)
    sql.execute(
        "INSERT INTO batonq.schedules (name, cron, tz, queue, payload, missed)"
        " SELECT format('customer-%%s', i), %s, 'UTC', 'nightly', jsonb_build_object('customer', i), 'skip'"
        "   FROM generate_series(1, %s) i",
        (f"{tick.second} {tick.minute} {tick.hour} * * *", NIGHTLY),
    )
    return tick


def _check_fired_once_on_time(admin: batonq.Client, sql: psycopg.Connection[Any], tick: datetime) -> float:
    """Every schedule fired ``tick`` once, on time (they say ``missed='skip'``:
    a tick the firer took for missed would not fire at all); the seconds
    from the tick to the last firing."""
    count = "SELECT count(*) FROM batonq.schedule_firings"
    wait_for(lambda: sql.execute(count).fetchone() == (NIGHTLY,), timeout=120, what="every tick fired")
    fired = sql.execute(
        "SELECT count(DISTINCT schedule), count(DISTINCT task_id), min(tick), max(tick), bool_or(catch_up),"
        " extract(epoch FROM max(fired_at) - %s) FROM batonq.schedule_firings",
        (tick,),
    ).fetchone()
    assert fired is not None
    schedules, tasks, first, last, catch_up, late_s = fired
    assert (schedules, tasks, first, last, catch_up) == (NIGHTLY, NIGHTLY, tick, tick, False)
    assert sql.execute("SELECT count(*) FROM batonq.tasks WHERE queue = 'nightly'").fetchone() == (NIGHTLY,)
    assert {s.next_tick for s in admin.schedules()} == {tick + timedelta(days=1)}
    return float(late_s)


def test_ten_thousand_schedules_due_on_one_tick_all_fire_on_time_once(
    dsn: str, admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    tick = _nightly_customers(admin, sql, in_s=12)
    sweepers = [batonq.Sweeper(dsn) for _ in range(2)]  # two workers: one leads
    for sweeper in sweepers:
        sweeper.start()
    try:
        late_s = _check_fired_once_on_time(admin, sql, tick)
    finally:
        for sweeper in sweepers:
            sweeper.stop()
    print(f"{NIGHTLY} schedules fired within {late_s:.2f} s of their tick")


def test_two_firers_at_once_fire_each_of_ten_thousand_ticks_once(
    dsn: str, admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    """Two sweepers that both believe they lead (one cut off from the
    database long enough to lose its lock, still firing) fire each tick once."""
    tick = _nightly_customers(admin, sql, in_s=12)
    stop = threading.Event()
    errors: list[BaseException] = []

    def fire() -> None:
        firer = batonq.Sweeper(dsn)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    firer._fire_schedules(conn)  # the leader's round, without the leader's lock
                    stop.wait(0.2)
        except BaseException as error:
            errors.append(error)

    firers = [threading.Thread(target=fire) for _ in range(2)]
    for firer in firers:
        firer.start()
    try:
        late_s = _check_fired_once_on_time(admin, sql, tick)
    finally:
        stop.set()
        for firer in firers:
            firer.join(timeout=60)
    assert errors == []
    print(f"{NIGHTLY} schedules fired by two firers within {late_s:.2f} s of their tick")
