"""The hot-table experiment runs every design end to end on its own private
cluster (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_scripts import run_bench

DESIGNS = ("today", "hot", "leases", "rotate", "rotate_named", "append")


def test_every_design_runs_and_reports_its_dead_rows(tmp_path: Path) -> None:
    run_bench("bench_hot_table.py", "--seconds", "2", "--out", str(tmp_path), timeout=600)

    [result] = tmp_path.glob("hot-table-*.json")
    by_design = {r["design"]: r for r in json.loads(result.read_text())["results"]}
    assert sorted(by_design) == sorted(DESIGNS)
    for design, r in by_design.items():
        assert r["tasks"] > 0, design
        assert r["db_cpu_us_per_task"] > 0, design
        assert r["wal_bytes_per_task"] > 0, design
    # What tells the designs apart: each task's claim and delete leave two
    # dead rows today, the HOT claim leaves (mostly) only the delete, and
    # the append-only floor none.
    assert by_design["today"]["dead_per_task"] >= 1.9
    assert 0.9 <= by_design["hot"]["dead_per_task"] < 1.9
    assert by_design["append"]["dead_per_task"] == 0
