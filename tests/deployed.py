"""The deploy/ configs as the tests run them: Debian's PgBouncer and nginx,
each in a temp dir on a free port, started and stopped by the test (not as
system services)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tests.e2e.live import free_port
from tests.waiting import wait_for

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
INSTALLED = "/opt/batonq/bin/batonq"  # where the systemd units expect batonq
USERS = (
    "postgres", "batonq_test_worker", "batonq_test_reader", "batonq_test_service", "batonq_api", "batonq_app"
)  # fmt: skip


def fill(template: Path, values: dict[str, str]) -> str:
    """A deploy/ config with its @NAME@ placeholders filled in."""
    text = template.read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    left = re.findall(r"@[A-Z_]+@", text)
    assert not left, f"unfilled placeholders in {template.name}: {left}"
    return text


@contextlib.contextmanager
def pgbouncer(server_dsn: str) -> Iterator[tuple[str, int]]:
    """A transaction-mode PgBouncer in front of ``server_dsn``'s server; yields (host, port)."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    server = conninfo_to_dict(server_dsn)
    with tempfile.TemporaryDirectory(prefix="batonq-pgbouncer-") as tmp:
        os.chmod(tmp, 0o777)  # pgbouncer drops root for the postgres user, which writes its log here
        port = free_port()
        config = Path(tmp, "pgbouncer.ini")
        config.write_text(fill(DEPLOY / "pgbouncer.ini", {
            "PG_HOST": str(server.get("host", "127.0.0.1")), "PG_PORT": str(server.get("port", 5432)),
            "PORT": str(port), "DIR": tmp,
        }))  # fmt: skip
        Path(tmp, "userlist.txt").write_text("".join(f'"{user}" ""\n' for user in USERS))
        as_user = ["-u", "postgres"] if os.geteuid() == 0 else []  # it refuses to run as root
        log = Path(tmp, "pgbouncer.log")
        proc = subprocess.Popen(
            [binary, *as_user, str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        try:
            probe = make_conninfo(server_dsn, host="127.0.0.1", port=port, connect_timeout=2)

            def up() -> bool:
                assert proc.poll() is None, f"pgbouncer exited:\n{log.read_text() if log.exists() else ''}"
                with contextlib.suppress(psycopg.OperationalError):
                    psycopg.connect(probe).close()
                    return True
                return False

            wait_for(up, timeout=15, what="pgbouncer to accept connections")
            yield "127.0.0.1", port
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@contextlib.contextmanager
def nginx(upstreams: list[int]) -> Iterator[str]:
    """nginx with deploy/nginx.conf in front of ``batonq serve`` on these
    loopback ports; yields its base URL."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    with tempfile.TemporaryDirectory(prefix="batonq-nginx-") as tmp:
        os.chmod(tmp, 0o777)  # its workers may run as another user
        port = free_port()
        config = Path(tmp, "nginx.conf")
        servers = "".join(f"server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;\n        " for p in upstreams)
        config.write_text(fill(DEPLOY / "nginx.conf", {"DIR": tmp, "PORT": str(port), "UPSTREAMS": servers}))
        log = Path(tmp, "error.log")
        proc = subprocess.Popen(
            [binary, "-p", tmp, "-c", str(config), "-e", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:

            def up() -> bool:
                assert proc.poll() is None, f"nginx exited:\n{log.read_text() if log.exists() else ''}"
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
                return False

            wait_for(up, timeout=15, what="nginx to accept connections")
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
