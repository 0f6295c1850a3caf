"""The core benchmark runs end to end in its quick mode (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
from tests.bench_scripts import run_bench

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_core.py"


def _scenario_names() -> list[str]:
    """The scenario names the script defines, read from its --help."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    flat = " ".join(out.split())
    listed = flat.split("comma-separated scenario names:", 1)[1].split("--out", 1)[0]
    return [name.strip() for name in listed.split(",") if name.strip()]


def test_quick_benchmark_writes_every_scenario(server_dsn: str, tmp_path: Path) -> None:
    names = _scenario_names()
    assert {"enqueue_b1_c1", "enqueue_b1_c8", "enqueue_b100_c1", "enqueue_b10000_c1"} <= set(names)
    assert {"claim_complete_b1_c4", "claim_complete_b10_c2", "claim_complete_b100_c2"} <= set(names)

    proc = run_bench("bench_core.py", "--quick", "--quiet", "--dsn", server_dsn, "--out", str(tmp_path))

    [result] = tmp_path.glob("core-*.json")
    report = json.loads(result.read_text())
    assert report["mode"] == "quick"
    assert report["postgres"]["version"]
    by_name = {s["name"]: s for s in report["scenarios"]}
    assert sorted(by_name) == sorted(names)
    for name, scenario in by_name.items():
        for system in ("batonq", "baseline"):
            summary = scenario[system]
            assert summary["median_tasks_per_s"] > 0, (name, system)
            assert all(rate > 0 for rate in summary["runs_tasks_per_s"]), (name, system)
        assert scenario["ratio"] > 0, name
    assert "claim_complete_b100_c2" in proc.stdout  # the printed table

    # The scratch database is gone again.
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s", (report["database"],)
        ).fetchall()
    assert left == []
