"""The queue-graph benchmark runs end to end in its quick mode (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_graph.py"
RATES = ("steady_tasks_per_s", "total_tasks_per_s", "steady_pipelines_per_s", "total_pipelines_per_s")


def test_quick_graph_benchmark(server_dsn: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dsn", server_dsn, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

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
