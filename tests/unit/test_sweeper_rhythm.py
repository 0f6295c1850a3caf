"""The sweeper's rhythm, without a database: sweeps every tick, maintenance
and the vacuum's reading of pg_stat_user_tables once per maintenance
interval."""

from __future__ import annotations

from typing import Any

import pytest

import batonq.sweeper
from batonq.sweeper import _VACUUM_DUE, Sweeper

TICKS = 300
TICK_S = 1.0


class _Rows:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


class _Database:
    """Answers the sweeper's statements as an owner's idle database does;
    each sweep is one tick of TICK_S on the clock; TICKS ticks, then stop."""

    def __init__(self, sweeper: Sweeper) -> None:
        self.sweeper = sweeper
        self.now = 1000.0
        self.statements: list[str] = []

    def monotonic(self) -> float:
        return self.now

    def execute(self, statement: str, params: Any = None) -> _Rows:
        self.statements.append(statement)
        if statement == "SELECT batonq.sweep()":
            if self.statements.count(statement) == TICKS:
                self.sweeper._stop.set()
            self.now += TICK_S
            return _Rows([(0,)])
        if statement == "SELECT batonq.maintain()":
            return _Rows([({},)])
        if statement == _VACUUM_DUE or "due_schedules" in statement:
            return _Rows([])
        return _Rows([(True,)])  # may vacuum; the leader's and the vacuum's locks


@pytest.mark.parametrize("maintain_every_s", [60.0, 1.0])
def test_the_vacuum_duty_reads_table_stats_once_per_maintenance(
    monkeypatch: pytest.MonkeyPatch, maintain_every_s: float
) -> None:
    sweeper = Sweeper("postgresql://unused", interval_s=0, maintain_every_s=maintain_every_s)
    database = _Database(sweeper)
    monkeypatch.setattr(batonq.sweeper, "time", database)
    sweeper._lead(database)  # type: ignore[arg-type]
    assert sweeper.is_leader and sweeper.vacuums_here
    expected = TICKS * TICK_S / maintain_every_s
    assert database.statements.count("SELECT batonq.sweep()") == TICKS
    assert database.statements.count("SELECT batonq.maintain()") == expected
    assert database.statements.count(_VACUUM_DUE) == expected
