"""The Python examples in docs/ run as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), re.DOTALL)


@pytest.mark.parametrize("page", ["README.md", "docs/graph.md", "docs/flow-control.md"])
def test_examples_run(
    page: str, admin_dsn: str, sql: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each page's python blocks run in order, in one namespace, as written."""
    monkeypatch.setenv("BATONQ_DATABASE_URL", admin_dsn)
    sql.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python example"
    namespace: dict[str, Any] = {}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{page}:example {number}", "exec"), namespace)


def test_readme_examples_did_what_they_say(
    admin_dsn: str, sql: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATONQ_DATABASE_URL", admin_dsn)
    sql.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
    namespace: dict[str, Any] = {}
    for block in python_blocks("README.md"):
        exec(compile(block, "README.md:example", "exec"), namespace)
    assert sql.execute("SELECT id FROM orders").fetchall() == [(17,)]
    states = sql.execute(
        """SELECT state, result FROM batonq.archive WHERE queue = 'shop:tasks'
           UNION ALL SELECT state, NULL FROM batonq.tasks WHERE queue = 'shop:tasks' ORDER BY 1"""
    ).fetchall()
    assert states == [("done", {"shipped": True}), ("pending", None)]
    assert "send_welcome" in namespace and "app" in namespace


def test_readme_worker_is_the_tested_example() -> None:
    """The worker in the README is examples/worker_quickstart.py, which the
    worker tests run end to end."""
    example = (ROOT / "examples" / "worker_quickstart.py").read_text(encoding="utf-8")
    code = example.split('"""', 2)[2].lstrip("\n")
    assert code in python_blocks("README.md")


def test_readme_curl_session_is_the_tested_one() -> None:
    """The README's curl session is docs/http.md's, which tests/e2e runs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    http = (ROOT / "docs" / "http.md").read_text(encoding="utf-8")
    sessions = [b for b in re.findall(r"```sh\n(.*?)```", readme, re.DOTALL) if "/v1/submit" in b]
    assert len(sessions) == 1
    assert sessions[0] in http


def _citus_section() -> str:
    text = (ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    return text.split("## Citus: distributing by queue", 1)[1].split("\n## ", 1)[0]


def test_the_citus_plan_names_every_table(sql: psycopg.Connection[Any]) -> None:
    """Its table of tables has one row per batonq table (partitions aside):
    a new table cannot be left out of the plan."""
    tables = {
        name
        for (name,) in sql.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'batonq'::regnamespace"
            " AND relkind IN ('r', 'p') AND NOT relispartition"
        ).fetchall()
    }
    tables_part = _citus_section().split("### Table by table", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)`((?:, `[a-z_]+`)*)", tables_part, re.M)
    planned = {first for first, _ in rows} | {n for _, more in rows for n in re.findall(r"`([a-z_]+)`", more)}
    assert planned == tables


def test_the_citus_plan_names_functions_that_exist(sql: psycopg.Connection[Any]) -> None:
    """Every create_distributed_function signature in the plan is one of the engine's."""
    named = re.findall(r"create_distributed_function\('([^']+)'", _citus_section())
    assert len(named) >= 7
    for signature in named:
        assert sql.execute("SELECT to_regprocedure(%s) IS NOT NULL", (signature,)).fetchone() == (True,), (
            signature
        )
