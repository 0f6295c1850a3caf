"""No DSN and no BATONQ_DATABASE_URL: batonq runs its own PostgreSQL."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.smoke

SCRIPT = """
import batonq
with batonq.connect() as client:
    first = client.enqueue("hello", {"n": 1}, idempotency_key="k")
    [lease] = client.claim("hello")
    client.complete(lease.lease_token, {"ok": True})
    print(first.task_id, client.task(first.task_id).state, client.dsn.startswith("postgresql://"))
"""


def test_embedded_default_runs_and_keeps_data(tmp_path: Path) -> None:
    env = {"BATONQ_HOME": str(tmp_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "done", "True"]
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()

    again = subprocess.run(
        [
            sys.executable,
            "-c",
            "import batonq\n"
            "with batonq.connect() as c: print(c.enqueue('hello', 2, idempotency_key='k').created)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "False"


def test_readme_serve_command_on_the_embedded_database(tmp_path: Path) -> None:
    """`batonq serve` with no database configured: it starts its own
    PostgreSQL, prints an admin key once, and answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"BATONQ_HOME": str(tmp_path), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path)}
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "batonq", "serve", "--port", str(port)], env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        keys = re.findall(r"bq_\d+_[0-9a-f]{64}", log.read_text())
        assert len(keys) == 1
        headers = {"Authorization": f"Bearer {keys[0]}"}
        made = httpx.post(f"http://127.0.0.1:{port}/v1/enqueue", headers=headers,
                          json={"queue": "hello", "payload": {"name": "world"}})  # fmt: skip
        assert made.status_code == 200 and made.json()["created"] is True
    finally:
        server.terminate()
        server.wait(timeout=30)
