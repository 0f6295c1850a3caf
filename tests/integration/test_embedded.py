"""No DSN and no BATONQ_DATABASE_URL: batonq runs its own PostgreSQL, in a
folder only its server may enter, and stops it with the last process using it."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.waiting import wait_for

from batonq.embedded import home

pytestmark = pytest.mark.smoke

SCRIPT = """
import batonq
with batonq.connect() as client:
    first = client.enqueue("hello", {"n": 1}, idempotency_key="k")
    [lease] = client.claim("hello")
    client.complete(lease.lease_token, {"ok": True})
    print(first.task_id, client.task(first.task_id).state, client.dsn.startswith("postgresql://"))
"""
BATONQ = [sys.executable, "-m", "batonq"]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A private $HOME (mode 0700, as users have them) and a $BATONQ_HOME
    outside it that the server's user can reach, as root too."""
    user_home = tmp_path / "home"
    user_home.mkdir(mode=0o700)
    batonq_home = Path(tempfile.mkdtemp(prefix="bq-"))
    batonq_home.chmod(0o711)
    env = {"BATONQ_HOME": str(batonq_home), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(user_home)}
    yield env
    embedded("stop", env)
    subprocess.run(["rm", "-rf", str(batonq_home)], check=True)


def embedded(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BATONQ, "embedded", command], env=env, capture_output=True, text=True, timeout=60)


def running(env: dict[str, str]) -> bool:
    return embedded("status", env).returncode == 0


def test_embedded_default_runs_and_keeps_data(env: dict[str, str]) -> None:
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "done", "True"]
    assert (Path(env["BATONQ_HOME"]) / "pgdata" / "PG_VERSION").exists()

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
    assert not running(env), "the last process using the server stopped it"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_readme_serve_command_on_the_embedded_database(env: dict[str, str], tmp_path: Path) -> None:
    """`batonq serve` with no database configured: it starts its own
    PostgreSQL, prints an admin key once, answers, and stops the server on
    SIGTERM; $HOME keeps its mode and the socket stays in the data folder."""
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen([*BATONQ, "serve", "--port", str(port)], env=env, stdout=out, stderr=out)
    try:

        def ready() -> bool:
            assert server.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout=60, what="batonq serve answers")
        keys = re.findall(r"bq_\d+_[0-9a-f]{64}", log.read_text())
        assert len(keys) == 1
        headers = {"Authorization": f"Bearer {keys[0]}"}
        made = httpx.post(f"http://127.0.0.1:{port}/v1/enqueue", headers=headers,
                          json={"queue": "hello", "payload": {"name": "world"}})  # fmt: skip
        assert made.status_code == 200 and made.json()["created"] is True

        status = embedded("status", env)
        pgdata = Path(env["BATONQ_HOME"]) / "pgdata"
        assert status.returncode == 0 and f"host={pgdata}" in status.stdout, status.stdout
        assert stat.S_IMODE(pgdata.stat().st_mode) == 0o700  # the socket's folder: its user's alone
        assert stat.S_IMODE(Path(env["HOME"]).stat().st_mode) == 0o700
        assert stat.S_IMODE(Path(env["BATONQ_HOME"]).stat().st_mode) == 0o711
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert not running(env), "batonq serve stopped its embedded server on SIGTERM"


def test_a_killed_process_leaves_the_server_to_the_next_one_or_to_stop(env: dict[str, str]) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", "import batonq, sys, time\nbatonq.connect().close()\nprint('up', flush=True)\n"
         "time.sleep(600)"],
        env=env, stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline() == "up\n"
        holder.send_signal(signal.SIGKILL)
    assert running(env), "nothing stopped it: the process was killed"

    # The next process to use it and exit normally stops it: the killed one is forgotten.
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert not running(env)

    # Or by hand.
    subprocess.Popen([sys.executable, "-c", "import batonq, os, signal\nbatonq.connect().close()\n"
                      "os.kill(os.getpid(), signal.SIGKILL)"], env=env).wait(timeout=60)  # fmt: skip
    assert running(env)
    stopped = embedded("stop", env)
    assert stopped.returncode == 0 and stopped.stdout.startswith("stopped"), stopped
    assert not running(env)
    again = embedded("stop", env)
    assert again.returncode == 0 and again.stdout.startswith("not running"), again


def test_a_home_too_long_for_the_socket_is_refused(env: dict[str, str]) -> None:
    """The socket is never moved to a shared folder: a long $BATONQ_HOME is
    refused, saying why."""
    long_home = Path(env["BATONQ_HOME"]) / ("h" * 100)
    run = subprocess.run([*BATONQ, "queues"], env={**env, "BATONQ_HOME": str(long_home)},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 1
    assert "error: embedded_unavailable: the embedded PostgreSQL's socket would be" in run.stderr
    assert "set BATONQ_HOME to a shorter path" in run.stderr
    assert not long_home.exists()


def test_a_home_the_servers_user_cannot_reach(env: dict[str, str], tmp_path: Path) -> None:
    """Run as root, PostgreSQL runs as the user pgserver: batonq refuses a
    $BATONQ_HOME behind a folder others may not pass, and leaves its mode as
    it was. Run as anyone else, the server is that user and such a home works."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    inside = {**env, "BATONQ_HOME": str(closed / "batonq")}
    run = subprocess.run([*BATONQ, "queues"], env=inside, capture_output=True, text=True, timeout=120)
    if os.geteuid() == 0:
        assert run.returncode == 1
        assert f"cannot pass through {closed} (mode 700)" in run.stderr, run.stderr
    else:
        assert run.returncode == 0, run.stderr
        subprocess.run([*BATONQ, "embedded", "stop"], env=inside, capture_output=True, timeout=60)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700


def test_roots_default_home_is_outside_its_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATONQ_HOME", raising=False)
    expected = Path("/var/lib/batonq") if os.geteuid() == 0 else Path.home() / ".local" / "share" / "batonq"
    assert home() == expected
