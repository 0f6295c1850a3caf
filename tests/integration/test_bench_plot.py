"""bench/plot.py turns result files into PNGs (smoke: no pixels are checked).

The result files are hand-written and tiny, but shaped like what the
benchmark scripts write (taken from their --quick outputs): bench_core.py's
core-*.json, bench_workers.py's workers-*.json, bench_latency.py's
latency-*.json and bench_backlog.py --json's rows.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PLOT = ROOT / "bench" / "plot.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNGS = ("core-throughput.png", "workers.png", "latency.png", "backlog.png")


def _rates(median: float, low: float, high: float) -> dict[str, Any]:
    """One system's summary in a core scenario, as bench_core._summary writes it."""
    runs = [low, median, high]
    return {
        "median_tasks_per_s": median,
        "min_tasks_per_s": low,
        "max_tasks_per_s": high,
        "runs_tasks_per_s": runs,
        "runs_seconds": [200 / r for r in runs],
        "wal_bytes_per_task": 1234.5,
        "checkpoints_during_runs": [0, 0, 0],
    }


def core_report() -> dict[str, Any]:
    scenarios = []
    shapes = [("enqueue", b, c) for b, c in ((1, 1), (1, 8), (100, 1), (10_000, 1))]
    shapes += [("claim_complete", b, c) for b in (1, 10, 100) for c in (1, 2, 4)]
    for op, batch, conns in shapes:
        base = 300.0 * batch**0.6 * conns**0.3
        scenarios.append(
            {
                "name": f"{op}_b{batch}_c{conns}",
                "op": op,
                "batch": batch,
                "connections": conns,
                "tasks_per_run": 200,
                "warmup_tasks": 0,
                "runs": 3,
                "batonq": _rates(base * 0.6, base * 0.5, base * 0.7),
                "baseline": _rates(base, base * 0.9, base * 1.1),
                "ratio": 0.6,
                "ratio_runs": [0.55, 0.6, 0.64],
            }
        )
    return {
        "benchmark": "core",
        "started_at": "2026-12-02T14:43:22+00:00",
        "mode": "quick",
        "runs": 3,
        "scale": 1.0,
        "batonq_version": "0.1.0",
        "git_commit": "0416fdd",
        "batonq_source": {"path": "/x/src/batonq", "commit": "0" * 40, "modified_files": 0},
        "machine": {
            "nproc": 2,
            "cpu_model": "AMD EPYC",
            "mem_total_kib": 24683584,
            "platform": "Linux-6.18-x86_64-with-glibc2.36",
            "python": "3.11.7",
            "psycopg": "3.3.9",
            "psycopg_impl": "binary",
            "loadavg_start": [1.0, 1.0, 0.8],
            "pressure_start": {"cpu": "some avg10=1.00 avg60=1.00 avg300=1.00 total=1"},
            "loadavg_end": [1.2, 1.1, 0.8],
            "pressure_end": {"cpu": "some avg10=1.00 avg60=1.00 avg300=1.00 total=2"},
        },
        "method": "Each run: ...",
        "scenarios": scenarios,
        "database": "batonq_bench_12990",
        "postgres": {"version": "PostgreSQL 15.20", "jit": "on"},
        "elapsed_s": 9.4,
        "command": "bench/bench_core.py --quick",
    }


def workers_report() -> dict[str, Any]:
    settings = {
        "batonq -c 200": 7000.0,
        "batonq -c 10 (default)": 1600.0,
        "pgqueuer batch 10 (default)": 1500.0,
        "pgqueuer batch 100": 4800.0,
        "procrastinate concurrency 1 (default)": 140.0,
        "procrastinate concurrency 10": 170.0,
    }

    def run(steady: float) -> dict[str, Any]:
        total = steady * 0.8
        return {
            "jobs": 500,
            "seconds": 500 / total,
            "total_per_s": total,
            "steady_per_s": steady,
            "startup_s": 0.4,
            "exit_code": 0,
        }

    def stats(value: float) -> dict[str, float]:
        return {"median": value, "min": value * 0.9, "max": value * 1.1}

    return {
        "when": "2026-12-02T14:44:28+00:00",
        "machine": {"cpus": 2, "platform": "Linux-6.18-x86_64-with-glibc2.36", "python": "3.11.7"},
        "versions": {"batonq": "0.1.0", "pgqueuer": "1.6.0", "procrastinate": "3.10.0"},
        "skipped": {},
        "args": {
            "dsn": "postgresql://postgres@127.0.0.1:5432/postgres",
            "quick": True,
            "runs": 2,
            "jobs": 500,
            "slow_jobs": 200,
            "only": "",
            "batonq_c": "200,10",
            "pgqueuer_venv": "/tmp/peer-pgqueuer",
            "procrastinate_venv": "/tmp/peer-procrastinate",
            "poll": 0.02,
            "deadline": 300.0,
            "keep": False,
        },
        "runs": {key: [run(v * 0.95), run(v * 1.05)] for key, v in settings.items()},
        "summary": {
            key: {"total_per_s": stats(v * 0.8), "steady_per_s": stats(v), "startup_s": stats(0.4)}
            for key, v in settings.items()
        },
    }


def latency_report() -> dict[str, Any]:
    return {
        "rate": 100.0,
        "seconds": 2.0,
        "batonq": [{"n": 200, "p50_ms": 8.2, "p99_ms": 31.0}, {"n": 200, "p50_ms": 10.7, "p99_ms": 50.2}],
        "raw": [{"n": 200, "p50_ms": 3.0, "p99_ms": 12.7}, {"n": 200, "p50_ms": 10.2, "p99_ms": 41.0}],
    }


def backlog_rows() -> list[dict[str, Any]]:
    def row(label: str, pending: int, archived: int, claim1: float) -> dict[str, Any]:
        return {
            "backlog": label,
            "pending_target": pending,
            "pending_other": pending,
            "archived": archived,
            "load_s": 0.2,
            "claim1_p50_ms": claim1,
            "claim1_p99_ms": claim1 * 8,
            "cycle1_p50_ms": claim1 * 2,
            "cycle1_p99_ms": claim1 * 12,
            "claim100_p50_ms": claim1 * 4,
            "claim100_p99_ms": claim1 * 9,
            "cycle100_p50_ms": claim1 * 10,
            "cycle100_p99_ms": claim1 * 20,
        }

    return [
        row("pending 1,000", 1_000, 0, 1.1),
        row("pending 10,000", 10_000, 0, 0.9),
        row("pending 1,000 again", 1_000, 0, 0.6),
        row("pending 1,000 + 10,000 done", 1_000, 10_000, 0.9),
    ]


def write_results(results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    files = {
        "core-20261202T144331Z.json": core_report(),
        "workers-20261202T144428.json": workers_report(),
        "latency-20261202T144423Z.json": latency_report(),
        "backlog-20261202T144334Z.json": backlog_rows(),
    }
    for name, body in files.items():
        (results / name).write_text(json.dumps(body, indent=2))


def run_plot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PLOT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC, path
    assert head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def test_plots_every_kind(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write_results(results)
    # An older file of a kind: the newest (by the name's timestamp) is the one plotted.
    (results / "latency-20200101T000000Z.json").write_text("not json")
    out = tmp_path / "img"

    proc = run_plot("--results", str(results), "--out", str(out))

    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in PNGS:
        png = out / name
        assert png.is_file(), name
        assert str(png) in proc.stdout.splitlines()
        assert png.stat().st_size > 20_000, name  # something was drawn
        width, height = png_size(png)
        assert width >= 800 and height >= 300, (name, width, height)
    assert sorted(p.name for p in out.iterdir()) == sorted(PNGS)


def test_missing_files_are_skipped(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "backlog-20261202T144334Z.json").write_text(json.dumps(backlog_rows()))
    out = tmp_path / "img"

    proc = run_plot("--results", str(results), "--out", str(out))

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [str(out / "backlog.png")]
    notes = proc.stderr.splitlines()
    assert len(notes) == 3, proc.stderr
    assert all(line.startswith("note: no ") and "skipped" in line for line in notes), notes


def test_a_named_file_and_a_malformed_one(tmp_path: Path) -> None:
    picked = tmp_path / "elsewhere.json"
    picked.write_text(json.dumps(latency_report()))
    results = tmp_path / "results"
    results.mkdir()
    (results / "core-20261202T144331Z.json").write_text(json.dumps({"benchmark": "core"}))
    out = tmp_path / "img"

    proc = run_plot("--results", str(results), "--out", str(out), "--latency", str(picked))

    assert proc.returncode == 1, proc.stdout + proc.stderr  # the core file is not a core report
    assert proc.stdout.splitlines() == [str(out / "latency.png")]
    assert "core-20261202T144331Z.json is not shaped like bench_core.py's output" in proc.stderr
    assert run_plot("--core", str(tmp_path / "missing.json")).returncode == 2
