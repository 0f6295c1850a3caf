"""The flow-control benchmark runs end to end in its quick mode (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from tests.bench_scripts import run_bench

SETTINGS = ("unlimited", "max_leased", "group_max_leased", "rate_limit", "group_rate_limit")


def test_quick_limits_benchmark(server_dsn: str, tmp_path: Path) -> None:
    proc = run_bench("bench_limits.py", "--quick", "--dsn", server_dsn, "--out", str(tmp_path))

    [result] = tmp_path.glob("limits-*.json")
    report = json.loads(result.read_text())
    assert report["mode"] == "quick"
    assert report["postgres"]["version"]
    [round_] = report["rounds"]
    assert set(round_) == set(SETTINGS)
    for setting in SETTINGS:
        assert round_[setting] > 0, setting
        assert report["summary"][setting]["ratio_to_unlimited"]["median"] > 0, setting
    assert report["summary"]["unlimited"]["ratio_to_unlimited"]["median"] == 1
    assert set(report["ratios"]) == {f"{s} / unlimited" for s in SETTINGS[1:]}  # what compare.py reads
    assert "ratio to unlimited" in proc.stdout  # the printed table
    assert "results OK" in proc.stderr  # every run's tasks were checked

    with psycopg.connect(server_dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s", (report["database"],)
        ).fetchall()
    assert left == []
