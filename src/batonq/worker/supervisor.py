"""``batonq worker --processes N``: N worker processes under one supervisor.

The supervisor runs no handlers. It starts the children (each a plain
``batonq worker`` with ``--processes 1 --no-sweeper``), takes part in the
sweeper election for all of them, forwards SIGTERM and SIGINT to them, and
starts a child again when it dies without being asked to, after a backoff
that doubles while children keep dying quickly. A child that exits 0 by
itself (``--burst``, ``--max-tasks``) is done and stays gone; the supervisor
exits once every child has.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from batonq.sweeper import Sweeper

__all__ = ["SUPERVISOR_ENV", "Supervisor", "die_with_supervisor"]

log = logging.getLogger("batonq.worker")

SUPERVISOR_ENV = "BATONQ_WORKER_SUPERVISOR"
"""Set in each child's environment to the supervisor's pid."""
_TICK_S = 0.2
_RESTART_BASE_S = 1.0
_RESTART_MAX_S = 30.0
_STABLE_S = 30.0
"""A child that ran this long resets the backoff."""
_KILL_AFTER_S = 15.0
"""After a stop, children still running this long past their grace are killed."""


@dataclass(slots=True)
class _Child:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restart_at: float | None = None
    backoff_s: float = _RESTART_BASE_S
    code: int | None = None
    """The exit code it ended with for good (no restart)."""


class Supervisor:
    """Run ``command(i)`` as child ``i`` for i in range(processes) until
    they are done or a signal stops them; ``run()`` returns the exit code:
    0 when every child ended with 0, else the first other code a child
    ended with (130 or 143 after a second signal)."""

    def __init__(
        self, command: Callable[[int], list[str]], processes: int, *, dsn: str, sweeper: bool, grace_s: float
    ) -> None:
        self.command = command
        self.children = [_Child(i) for i in range(processes)]
        self.dsn = dsn
        self.sweeper = sweeper
        self.grace_s = grace_s
        self._stop_at: float | None = None
        self._signals: list[int] = []

    def run(self) -> int:
        sweeper = Sweeper(self.dsn) if self.sweeper else None
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            if sweeper is not None:
                sweeper.start()
            for child in self.children:
                self._spawn(child)
            log.info("supervisor %d: %d worker processes (pids %s)", os.getpid(), len(self.children),
                     ", ".join(str(c.proc.pid) for c in self.children if c.proc))  # fmt: skip
            while self._tick():
                time.sleep(_TICK_S)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for child in self.children:
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.kill()
                    child.proc.wait()
            if sweeper is not None:
                sweeper.stop()
        codes = [c.code for c in self.children if c.code]
        return codes[0] if codes else 0

    def _spawn(self, child: _Child) -> None:
        env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
        # A session of its own: a terminal's Ctrl-C reaches the supervisor
        # only, which forwards it once (twice would stop the child at once).
        child.proc = subprocess.Popen(self.command(child.index), env=env, start_new_session=True)
        child.started = time.monotonic()
        child.restart_at = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Forward the signal: the first stops claiming, a second stops at
        once (the children count them the same way)."""
        self._signals.append(signum)
        if self._stop_at is None:
            self._stop_at = time.monotonic() + self.grace_s + _KILL_AFTER_S
            log.info("%s: stopping %d worker processes", signal.Signals(signum).name, self._alive())
        for child in self.children:
            child.restart_at = None
            if child.proc is not None and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signum)

    def _alive(self) -> int:
        return sum(1 for c in self.children if c.proc is not None and c.proc.poll() is None)

    def _tick(self) -> bool:
        """Reap and restart children; False once all are done."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None and (code := child.proc.poll()) is not None:
                self._ended(child, code, now)
            if child.restart_at is not None and now >= child.restart_at and self._stop_at is None:
                self._spawn(child)
                log.info("worker process %d started again", child.index)
        if self._stop_at is not None and now >= self._stop_at:
            for child in self.children:
                if child.proc is not None and child.proc.poll() is None:
                    log.warning("worker process %d (pid %d) still running: killing it", child.index,
                                child.proc.pid)  # fmt: skip
                    child.proc.kill()
        return any(c.proc is not None or c.restart_at is not None for c in self.children)

    def _ended(self, child: _Child, code: int, now: float) -> None:
        assert child.proc is not None
        pid, child.proc = child.proc.pid, None
        if self._stop_at is not None or code == 0:
            if len(self._signals) == 1 and code == -self._signals[0]:
                # Killed by the first signal itself: it had not set up its
                # handlers yet, so it held no lease.
                code = 0
            child.code = code if code >= 0 else 128 - code
            return
        if now - child.started >= _STABLE_S:
            child.backoff_s = _RESTART_BASE_S
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        log.warning("worker process %d (pid %d) %s: restarting it in %g s", child.index, pid, how,
                    child.backoff_s)  # fmt: skip
        child.restart_at = now + child.backoff_s
        child.backoff_s = min(child.backoff_s * 2, _RESTART_MAX_S)


def die_with_supervisor() -> None:
    """In a child: get SIGTERM when the supervisor dies (Linux), so no
    worker outlives it; exit at once if it is already gone."""
    supervisor = os.environ.pop(SUPERVISOR_ENV, None)
    if supervisor is None:
        return
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(supervisor):
        raise SystemExit(0)
