"""Cron arithmetic for schedules: which ticks are due, read with croniter
(five fields, or six with seconds first, as Quartz and Spring read them)
in the schedule's time zone (zoneinfo), so daylight saving time moves the
ticks as a wall clock would. The engine keeps everything else (which tick
fired, the missed-tick policy): see batonq.fire_schedules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from batonq.errors import InvalidArgument

__all__ = ["MAX_TICKS", "FirePlan", "check", "plan", "upcoming"]

MAX_TICKS = 1000
"""At most this many on-time ticks are fired in one round (a schedule that
ticks faster than the firer runs catches up over the next rounds)."""


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What a due schedule fires now: ``ticks`` on time, ``missed`` (the
    newest tick that passed while no firer ran, if any), and ``next_tick``,
    the first tick after the last one planned."""

    missed: datetime | None
    ticks: list[datetime]
    next_tick: datetime


def check(cron: str, tz: str) -> None:
    """Raise ``InvalidArgument`` unless ``cron`` is a cron expression (five
    fields, or six with seconds first) and ``tz`` an IANA time zone."""
    # croniter would read a seventh field as the year: refused, as the
    # message says.
    if len(cron.split()) not in (5, 6) or not croniter.is_valid(cron, second_at_beginning=True):
        raise InvalidArgument(
            f"invalid cron expression {cron!r}: use five fields (minute hour day month weekday)"
            " or six with seconds first (second minute hour day month weekday)"
        )
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"unknown time zone {tz!r}: use an IANA name such as Europe/Berlin") from None
    try:
        _after(cron, zone, datetime.now(UTC))
    except CroniterBadDateError:
        raise InvalidArgument(f"cron expression {cron!r} never fires (no such date)") from None


# Remembered: schedules due at once mostly share their cron and their tick
# (a nightly job per customer), and croniter takes about a millisecond a call.
@lru_cache(maxsize=4096)
def _after(cron: str, zone: ZoneInfo, moment: datetime) -> datetime:
    """The first tick strictly after ``moment``, in UTC."""
    tick: datetime = croniter(cron, moment.astimezone(zone), second_at_beginning=True).get_next(datetime)
    return tick.astimezone(UTC)


@lru_cache(maxsize=4096)
def _before(cron: str, zone: ZoneInfo, moment: datetime) -> datetime:
    """The last tick strictly before ``moment``, in UTC."""
    tick: datetime = croniter(cron, moment.astimezone(zone), second_at_beginning=True).get_prev(datetime)
    return tick.astimezone(UTC)


def plan(
    cron: str,
    tz: str,
    *,
    armed_at: datetime,
    next_tick: datetime | None,
    now: datetime,
    grace_s: float,
) -> FirePlan:
    """The ticks of a schedule due at ``now`` (the database's clock).

    The first candidate is ``next_tick``, or the first tick after
    ``armed_at`` for a schedule not fired yet. A tick more than ``grace_s``
    old at ``now`` was missed: of those only the newest is named (the
    engine fires it once, or skips it, as the schedule says).
    """
    zone = ZoneInfo(tz)
    first = next_tick if next_tick is not None else _after(cron, zone, armed_at)
    cutoff = now - timedelta(seconds=grace_s)
    missed = None
    tick = first
    if first < cutoff:
        missed = _before(cron, zone, cutoff + timedelta(microseconds=1))
        tick = _after(cron, zone, missed)
    ticks: list[datetime] = []
    while tick <= now and len(ticks) < MAX_TICKS:
        ticks.append(tick)
        tick = _after(cron, zone, tick)
    return FirePlan(missed, ticks, tick)


def upcoming(cron: str, tz: str, first: datetime | None, count: int, *, now: datetime) -> list[datetime]:
    """The next ``count`` ticks from ``first`` (a schedule's ``next_tick``;
    None: the first after ``now``), in UTC."""
    zone = ZoneInfo(tz)
    tick = first if first is not None else _after(cron, zone, now)
    ticks = [tick]
    while len(ticks) < count:
        ticks.append(_after(cron, zone, ticks[-1]))
    return ticks
