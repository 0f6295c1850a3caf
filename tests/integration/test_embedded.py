"""No DSN and no BATONQ_DATABASE_URL: batonq runs its own PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.smoke

SCRIPT = """
import batonq
with batonq.connect() as client:
    first = client.enqueue("hello", {"n": 1}, key="k")
    [lease] = client.claim("hello")
    client.complete(lease.lease_token, {"ok": True})
    print(first.task_id, client.task(first.task_id).state, client.dsn.startswith("postgresql://"))
"""


def test_embedded_default_runs_and_keeps_data(tmp_path: Path) -> None:
    env = {"BATONQ_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "done", "True"]
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()

    again = subprocess.run(
        [
            sys.executable,
            "-c",
            "import batonq\nwith batonq.connect() as c: print(c.enqueue('hello', 2, key='k').created)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "False"
