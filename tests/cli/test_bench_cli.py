"""``batonq bench``: the core benchmark from the command line, in its quick mode
(no timing assertions), and its refusal for a role that may not create databases."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
from click.testing import CliRunner

from batonq.cli import main

ONLY = ("enqueue_b1_c1", "claim_complete_b10_c2")


def database_exists(server_dsn: str, name: str) -> bool:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        return conn.execute("SELECT FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def test_help_says_what_is_measured_and_how_long() -> None:
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    flat = " ".join(result.output.split())
    for words in ("baseline", "ratio", "scratch database", "several minutes", "--quick takes seconds"):
        assert words in flat
    assert "Example" in result.output
    assert "claim_complete_b100_c4" in flat  # --only lists the scenarios
    assert "Default: the current directory" in flat  # --out


def test_quick_bench_on_two_scenarios(server_dsn: str, tmp_path: Path) -> None:
    args = ["--dsn", server_dsn, "bench", "--quick", "--only", ",".join(ONLY), "--out", str(tmp_path)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output

    [path] = tmp_path.glob("core-*.json")
    report = json.loads(path.read_text())
    assert report["benchmark"] == "core"
    assert report["mode"] == "quick"
    assert report["command"] == f"batonq bench --quick --only {','.join(ONLY)}"
    assert [s["name"] for s in report["scenarios"]] == list(ONLY)
    for scenario in report["scenarios"]:
        for system in ("batonq", "baseline"):
            assert scenario[system]["median_tasks_per_s"] > 0, (scenario["name"], system)
            assert all(rate > 0 for rate in scenario[system]["runs_tasks_per_s"])
        assert scenario["ratio"] > 0

    # Progress (one line per scenario) on stderr; the table and the file on stdout.
    assert [line for line in result.stderr.splitlines() if line.startswith("[")] == [
        "[1/2] enqueue_b1_c1: 200 tasks x 1 run (warm-up 0)",
        "[2/2] claim_complete_b10_c2: 300 tasks x 1 run (warm-up 0)",
    ]
    table = result.stdout.splitlines()
    assert table[0].split()[:3] == ["scenario", "batonq", "tasks/s"]
    assert [line.split()[0] for line in table[2:4]] == list(ONLY)
    assert table[-1] == f"results: {path}"

    # The scratch database is gone again.
    assert report["database"] == f"batonq_bench_{os.getpid()}"
    assert not database_exists(server_dsn, report["database"])


def test_a_role_that_may_not_create_databases_gets_a_clear_error(
    dsn: str, server_dsn: str, tmp_path: Path
) -> None:
    """``dsn`` is a login role with nothing but batonq_worker's grants."""
    result = CliRunner().invoke(main, ["--dsn", dsn, "bench", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    assert result.stderr.startswith(
        "error: permission_denied: role batonq_test_worker may not create databases"
    ), result.stderr
    assert "superuser" in result.stderr
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []
    assert not database_exists(server_dsn, f"batonq_bench_{os.getpid()}")
