"""Which ticks of a schedule are due: cron arithmetic in the schedule's time
zone, and the split between ticks on time and ticks missed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from batonq.errors import InvalidArgument
from batonq.schedules import check, plan


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_a_daily_tick_stays_at_its_wall_clock_time_across_dst() -> None:
    # 07:00 in Berlin is 06:00 UTC in winter and 05:00 UTC in summer (DST
    # began on 29 March 2026).
    due = plan("0 7 * * *", "Europe/Berlin", armed_at=utc(2026, 3, 28, 12), next_tick=None,
               now=utc(2026, 3, 28, 12), grace_s=2)  # fmt: skip
    assert (due.missed, due.ticks, due.next_tick) == (None, [], utc(2026, 3, 29, 5))


def test_a_tick_in_the_hour_dst_repeats_fires_at_both_of_its_moments() -> None:
    # 02:30 in Berlin happens twice on 31 October 2027: 00:30 UTC (summer
    # time) and 01:30 UTC (winter time), as docs/flow-control.md says.
    due = plan("30 2 * * *", "Europe/Berlin", armed_at=utc(2027, 10, 30, 12), next_tick=None,
               now=utc(2027, 10, 31, 3), grace_s=10**9)  # fmt: skip
    assert due.ticks == [utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 1, 30)]
    assert due.next_tick == utc(2027, 11, 1, 1, 30)


def test_ticks_within_the_grace_fire_and_older_ones_are_missed() -> None:
    now = utc(2026, 1, 1, 12, 0, 10, 500000)
    nine = utc(2026, 1, 1, 12, 0, 9)
    on_time = plan("* * * * * *", "UTC", armed_at=now, next_tick=nine, now=now, grace_s=2)
    assert (on_time.missed, on_time.ticks) == (None, [utc(2026, 1, 1, 12, 0, 9), utc(2026, 1, 1, 12, 0, 10)])
    after_outage = plan("* * * * * *", "UTC", armed_at=now, next_tick=utc(2026, 1, 1, 12, 0, 1), now=now,
                        grace_s=2)  # fmt: skip
    # 12:00:01 to 12:00:08 were missed (the newest named), 12:00:09 and :10 are on time.
    assert after_outage.missed == utc(2026, 1, 1, 12, 0, 8)
    assert after_outage.ticks == [utc(2026, 1, 1, 12, 0, 9), utc(2026, 1, 1, 12, 0, 10)]
    assert after_outage.next_tick == utc(2026, 1, 1, 12, 0, 11)


def test_a_week_long_outage_names_one_missed_tick() -> None:
    now = utc(2026, 1, 8, 0, 0, 0, 1000)
    due = plan("*/5 * * * *", "UTC", armed_at=now - timedelta(days=8), next_tick=utc(2026, 1, 1), now=now,
               grace_s=2)  # fmt: skip
    assert due.missed == utc(2026, 1, 7, 23, 55)
    assert due.ticks == [utc(2026, 1, 8)]


@pytest.mark.parametrize(("cron", "tz"), [("61 * * * *", "UTC"), ("* * * * *", "Europe/Atlantis")])
def test_bad_expressions_and_zones_are_refused(cron: str, tz: str) -> None:
    with pytest.raises(InvalidArgument):
        check(cron, tz)


def test_six_fields_put_the_seconds_first() -> None:
    """``*/10 * * * * *`` fires every ten seconds, as docs/flow-control.md
    says (and as Quartz and Spring read six fields)."""
    start = utc(2026, 1, 1, 12, 0, 3)
    due = plan("*/10 * * * * *", "UTC", armed_at=start, next_tick=None, now=start + timedelta(minutes=1),
               grace_s=10**9)  # fmt: skip
    assert due.ticks == [utc(2026, 1, 1, 12, 0, s) for s in (10, 20, 30, 40, 50)] + [utc(2026, 1, 1, 12, 1)]
    assert due.next_tick == utc(2026, 1, 1, 12, 1, 10)
    # Second 30 of minute 0 of hour 2: once a day.
    daily = plan("30 0 2 * * *", "UTC", armed_at=start, next_tick=None, now=start, grace_s=2)
    assert daily.next_tick == utc(2026, 1, 2, 2, 0, 30)
    check("*/10 * * * * *", "UTC")


@pytest.mark.parametrize("cron", ["* * * * * * *", "0 0 1 1 * * 2030", "* * * *"])
def test_only_five_or_six_fields_are_accepted(cron: str) -> None:
    with pytest.raises(InvalidArgument, match=r"use five fields .* or six with seconds first"):
        check(cron, "UTC")
