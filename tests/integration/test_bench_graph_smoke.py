"""The queue-graph benchmark runs end to end in its quick mode (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from tests.bench_scripts import run_bench

RATES = ("steady_tasks_per_s", "total_tasks_per_s", "steady_pipelines_per_s", "total_pipelines_per_s")


def test_quick_graph_benchmark(server_dsn: str, tmp_path: Path) -> None:
    proc = run_bench("bench_graph.py", "--quick", "--dsn", server_dsn, "--out", str(tmp_path))

    [result] = tmp_path.glob("graph-*.json")
    report = json.loads(result.read_text())
    assert report["mode"] == "quick"
    assert report["postgres"]["version"]
    summary = report["summary"]
    for system in ("graph", "baseline"):
        [run] = report["runs"][system]
        assert run["pipelines"] == 300
        assert run["tasks"] == 900
        for metric in RATES:
            assert run[metric] > 0, (system, metric)
            assert summary[system][metric]["median"] > 0, (system, metric)
    assert report["runs"]["graph"][0]["first_pipeline_s"] is not None
    assert summary["ratio_graph_to_baseline"]["total"] > 0
    assert "graph / baseline" in proc.stdout  # the printed table
    assert "results OK" in proc.stderr  # each run's results were checked

    # The scratch database is gone again.
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s", (report["database"],)
        ).fetchall()
    assert left == []
