"""Helpers for the worker tests: waiting with a deadline (never a bare
sleep as synchronisation), reading tasks behind the engine's back, and
running ``batonq worker`` as its own process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
BATONQ = str(Path(sys.executable).with_name("batonq"))


async def eventually_async(
    check: Callable[[], Awaitable[T | None]], *, timeout: float, what: str = "", every: float = 0.05
) -> T:
    """``eventually`` for a coroutine check, without blocking the loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout} s: {what or check}")
        await asyncio.sleep(every)


def states(sql: psycopg.Connection[Any], queue: str | None = None) -> dict[int, str]:
    """Every task's state, hot or archived, by id."""
    rows = sql.execute(
        """SELECT id, state FROM batonq.tasks WHERE %(q)s::text IS NULL OR queue = %(q)s
           UNION ALL
           SELECT id, state FROM batonq.archive WHERE %(q)s::text IS NULL OR queue = %(q)s""",
        {"q": queue},
    ).fetchall()
    return {task_id: state for task_id, state in rows}


def leased(sql: psycopg.Connection[Any], at_least: int = 2) -> int:
    """How many tasks are leased now, once at least ``at_least`` are (else 0)."""
    row = sql.execute("SELECT count(*) FROM batonq.tasks WHERE state = 'leased'").fetchone()
    count = int(row[0]) if row else 0
    return count if count >= at_least else 0


class WorkerProcess:
    """``batonq worker ...`` as its own OS process, run from the repo root
    (so ``tests.worker.worker_apps`` imports); stderr goes to a file."""

    def __init__(
        self, args: Sequence[str], tmp_path: Path, *, cwd: Path = ROOT, env: dict[str, str] | None = None
    ) -> None:
        self.log_path = tmp_path / f"worker-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [BATONQ, "worker", *args], cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout} s:\n{self.log()}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()
