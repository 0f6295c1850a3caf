"""A private PostgreSQL cluster for tests that restart or stop the server.

``initdb`` in a temporary directory with the binaries the ``pgserver``
package ships, listening on a free loopback port; stopped and removed
afterwards. The machine's shared server is never touched. As root the
cluster runs as the ``pgserver`` system user (PostgreSQL refuses root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.e2e.live import free_port

__all__ = ["PrivateCluster", "private_cluster", "private_standby"]


class PrivateCluster:
    def __init__(self, pgdata: Path, port: int, user: str | None) -> None:
        self.pgdata, self.port, self.user = pgdata, port, user
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", *args)

    def start(self) -> None:
        self.pg_ctl("-l", str(self.pgdata / "log"), "-o", f"-p {self.port} -k '' -h 127.0.0.1", "start")

    def restart_immediate(self) -> None:
        """Crash and restart: every connection is cut, the server recovers from WAL."""
        self.pg_ctl("-l", str(self.pgdata / "log"), "-m", "immediate", "restart")

    def stop(self) -> None:
        self.pg_ctl("-m", "immediate", "stop")

    def _run(self, program: str, *args: str) -> None:
        options: dict[str, Any] = {"user": self.user} if self.user else {}
        # Output to a file, not a pipe: the server pg_ctl starts keeps its
        # copy of a pipe open, and reading to its end would never finish.
        with tempfile.TemporaryFile() as output:
            done = subprocess.run(
                [str(_bin() / program), *args], stdin=subprocess.DEVNULL, stdout=output,
                stderr=subprocess.STDOUT, timeout=90, **options,
            )  # fmt: skip
            if done.returncode != 0:
                output.seek(0)
                raise RuntimeError(f"{program} {' '.join(args)} failed:\n{output.read().decode()}")


def _bin() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgserver warns on import when XDG_RUNTIME_DIR is unset
        from pgserver._commands import POSTGRES_BIN_PATH
    return POSTGRES_BIN_PATH


@contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    user = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgserver.utils import ensure_user_exists

        user = "pgserver"
        ensure_user_exists(user)
    top = Path(tempfile.mkdtemp(prefix="batonq-private-pg-"))
    pgdata = top / "data"
    try:
        if user:
            shutil.chown(top, user)
        cluster = PrivateCluster(pgdata, free_port(), user)
        cluster._run("initdb", "-D", str(pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(top, ignore_errors=True)


@contextmanager
def private_standby(primary: PrivateCluster) -> Iterator[PrivateCluster]:
    """A streaming replica of ``primary`` (``pg_basebackup -R``: its WAL
    streamed from the primary, read-only) on another free port."""
    top = Path(tempfile.mkdtemp(prefix="batonq-private-standby-"))
    pgdata = top / "data"
    try:
        if primary.user:
            shutil.chown(top, primary.user)
        standby = PrivateCluster(pgdata, free_port(), primary.user)
        standby._run("pg_basebackup", "-D", str(pgdata), "-R", "-X", "stream", "-c", "fast",
                     "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres")  # fmt: skip
        standby.start()
        try:
            yield standby
        finally:
            standby.stop()
    finally:
        shutil.rmtree(top, ignore_errors=True)
