"""The one benchmark command runs every script's small mode and plots the
results (no timing assertions): the benchmarks cannot rot unnoticed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.bench_scripts import run_bench

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(660)  # above run_bench's own 600 s
def test_run_all_quick_writes_every_result_and_plot(server_dsn: str, tmp_path: Path) -> None:
    run_bench("run_all.py", "--quick", "--no-peers", "--dsn", server_dsn, "--out", str(tmp_path), timeout=600)

    kinds = ("userpath", "core", "workers", "latency", "backlog", "graph", "limits", "http", "idle")
    for kind in (*kinds, "sustained"):
        files = list(tmp_path.glob(f"{kind}-*.json"))
        assert len(files) == 1, (kind, sorted(p.name for p in tmp_path.iterdir()))
        assert json.loads(files[0].read_text()), kind
    workers = json.loads(next(tmp_path.glob("workers-*.json")).read_text())
    assert set(workers["skipped"]) <= {"pgqueuer", "procrastinate"}

    plots = sorted((tmp_path / "img").glob("*.png"))
    assert [p.name for p in plots] == ["backlog.png", "core-throughput.png", "latency.png", "workers.png"]
    for plot in plots:
        assert plot.read_bytes().startswith(PNG), plot.name
