"""A private PostgreSQL cluster for the fault battery: the scenarios restart,
kill and starve it, so it is never the shared server the rest of the suite uses.

The binaries are Debian's (``/usr/lib/postgresql/N/bin``) when present, else
the ones the ``pgserver`` package ships (a dependency of batonq, so a clean
clone has them). Run as root, the server runs as an unprivileged system user
(``postgres`` if it exists, else ``pgserver``'s), as PostgreSQL demands.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from tests.e2e.live import free_port

import batonq

WORKER_ROLE = "chaos_worker"


def _bindir() -> Path:
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if debian:
        return debian[-1].parent
    import pgserver  # the wheel's own PostgreSQL build

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def _system_user() -> str | None:
    """Who the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(["useradd", "-s", "/bin/sh", "pgserver"], check=True, capture_output=True)
    return "pgserver"


class Cluster:
    """One initdb'ed cluster on a free loopback port, fsync on."""

    def __init__(self, *, autovacuum: bool = True, max_connections: int = 200) -> None:
        self.bindir = _bindir()
        self.user = _system_user()
        self._tmp = tempfile.mkdtemp(prefix="batonq-chaos-")
        os.chmod(self._tmp, 0o755)
        self.pgdata = Path(self._tmp) / "data"
        self.logfile = Path(self._tmp) / "server.log"
        self.port = free_port()
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": self._tmp,
            "fsync": "on",
            "autovacuum": "on" if autovacuum else "off",
            "max_connections": str(max_connections),
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
        }
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(self._tmp, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-instructions")  # fmt: skip
        self.start()

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.bindir / tool), *args], user=self.user, capture_output=True, text=True,
            cwd=self._tmp, timeout=120,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done

    @property
    def dsn(self) -> str:
        return self.url("postgres")

    def url(self, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}?connect_timeout=5"

    def _options(self) -> str:
        return " ".join(f"-c {k}={v}" for k, v in self.settings.items())

    def start(self) -> None:
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.pgdata), "-l", str(self.logfile),
                  "-o", self._options())  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-D", str(self.pgdata), "-m", mode, check=False)

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: every backend dies unflushed; crash recovery on start."""
        self._run("pg_ctl", "restart", "-w", "-t", "60", "-m", "immediate", "-D", str(self.pgdata),
                  "-l", str(self.logfile), "-o", self._options())  # fmt: skip

    def create_database(self, name: str) -> str:
        """A migrated batonq database, with a login role that only has batonq_worker's grants;
        returns the owner's DSN."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
            with contextlib.suppress(psycopg.errors.DuplicateObject):
                conn.execute(f"CREATE ROLE {WORKER_ROLE} LOGIN")
        batonq.migrate(self.url(name))
        with psycopg.connect(self.url(name), autocommit=True) as conn:
            conn.execute(f"GRANT batonq_worker TO {WORKER_ROLE}")
        return self.url(name)

    def sql(self, dbname: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self._tmp, ignore_errors=True)


@contextlib.contextmanager
def private_cluster(**options: Any) -> Iterator[Cluster]:
    cluster = Cluster(**options)
    try:
        yield cluster
    finally:
        cluster.close()
