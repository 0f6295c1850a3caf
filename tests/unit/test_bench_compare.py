"""bench/compare.py on canned result files: every ratio old -> new, and the
ones that fell by more than 10% flagged (what run_all.py runs last)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.bench_scripts import ROOT


def _write(results: Path, name: str, report: Any, mtime: float) -> Path:
    path = results / name
    path.write_text(json.dumps(report))
    os.utime(path, (mtime, mtime))
    return path


def _workers(batonq: float, pgqueuer: float) -> dict[str, Any]:
    def rate(median: float) -> dict[str, Any]:
        return {"steady_per_s": {"median": median}, "total_per_s": {"median": median / 2}}

    return {"summary": {"batonq -c 200": rate(batonq), "pgqueuer batch 100": rate(pgqueuer)}}


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "compare.py"), *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


def test_ratios_that_fell_by_more_than_10_percent_are_flagged(tmp_path: Path) -> None:
    old, new = 1_000_000.0, 2_000_000.0
    _write(tmp_path, "userpath-1.json", {"ratios": {"batonq": {"pgqueuer": 2.0, "raw": 0.60}}}, old)
    _write(tmp_path, "userpath-2.json", {"ratios": {"batonq": {"pgqueuer": 1.7, "raw": 0.58}}}, new)
    _write(tmp_path, "workers-1.json", _workers(30_000, 18_000), old)
    _write(tmp_path, "workers-2.json", _workers(36_000, 18_000), new)
    _write(tmp_path, "core-1.json", {"scenarios": [{"name": "claim_b100_c1", "ratio": 0.64}]}, old)
    _write(tmp_path, "core-2.json", {"scenarios": [{"name": "claim_b100_c1", "ratio": 0.60}]}, new)
    latency = {"raw": [{"p50_ms": 1.0, "p99_ms": 2.0}], "batonq": [{"p50_ms": 1.7, "p99_ms": 2.6}]}
    _write(tmp_path, "latency-1.json", latency, old)
    latency["batonq"] = [{"p50_ms": 2.0, "p99_ms": 2.6}]
    _write(tmp_path, "latency-2.json", latency, new)
    _write(tmp_path, "backlog-1.json", [{"p50_ms": 0.5}], old)  # no ratio: left out
    _write(tmp_path, "backlog-2.json", [{"p50_ms": 5.0}], new)

    done = _compare("--results", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()

    def line(name: str) -> str:
        return next(x for x in lines if x.strip().startswith(name))

    assert "2.00 ->    1.70 (-15%)  FELL 15%" in line("batonq / pgqueuer")
    assert line("batonq / raw").endswith("(-3%)")  # within 10%: not flagged
    assert line("batonq -c 200 / pgqueuer batch 100").endswith("1.67 ->    2.00 (+20%)")
    assert "FELL" not in line("claim_b100_c1")  # -6%
    assert "FELL 15%" in line("p50 raw / batonq") and "FELL" not in line("p99 raw / batonq")
    assert not any("backlog" in x for x in lines)
    assert lines[-1] == "fell by more than 10%: latency p50 raw / batonq; userpath batonq / pgqueuer"


def test_two_files_and_nothing_fell(tmp_path: Path) -> None:
    old = _write(tmp_path, "core-a.json", {"scenarios": [{"name": "enqueue_b1_c1", "ratio": 0.70}]}, 1.0)
    new = _write(tmp_path, "core-b.json", {"scenarios": [{"name": "enqueue_b1_c1", "ratio": 0.66}]}, 2.0)
    done = _compare(str(old), str(new))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "core: core-a.json -> core-b.json",
        f"  {'enqueue_b1_c1':<58}    0.70 ->    0.66 (-6%)",
    ]


def test_sustained_ratios_per_w_against_every_system(tmp_path: Path) -> None:
    """The sustained run's ratios, batonq over the raw loop and each peer at
    each W; a file written before the peers joined still compares on raw."""
    _write(tmp_path, "sustained-1.json", {"batonq_vs_raw": {"W64": 0.80}}, 1.0)
    _write(tmp_path, "sustained-2.json", {"ratios": {"W64 batonq": {"raw": 0.70, "pgq": 0.40}}}, 2.0)
    _write(tmp_path, "sustained-3.json", {"ratios": {"W64 batonq": {"raw": 0.69, "pgq": 0.30}}}, 3.0)

    done = _compare(str(tmp_path / "sustained-1.json"), str(tmp_path / "sustained-2.json"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0.80 ->    0.70 (-13%)  FELL 13%" in done.stdout.splitlines()[1]

    done = _compare("--results", str(tmp_path))
    lines = done.stdout.splitlines()
    assert lines[1:3] == [
        f"  {'W64 batonq / pgq':<58}    0.40 ->    0.30 (-25%)  FELL 25%",
        f"  {'W64 batonq / raw':<58}    0.70 ->    0.69 (-1%)",
    ], lines
    assert lines[-1] == "fell by more than 10%: sustained W64 batonq / pgq"
