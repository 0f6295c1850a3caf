"""A batonq worker run as its own OS process by the concurrency and chaos tests.

    python tests/proc_worker.py drain DSN QUEUE BATCH NAME
        Prints "ready", waits for a "go" line on stdin, then claims BATCH tasks
        at a time and completes them (complete for 1, complete_many for more)
        until a claim comes back empty. Prints one JSON line: every lease it
        held as [task_id, fencing_token], and every refused completion.

    python tests/proc_worker.py hold DSN QUEUE LEASE_S WAIT_S NAME
        Prints "ready", long-polls one claim under a LEASE_S lease, prints the
        lease as JSON, and then sits on it until it is killed.

    python tests/proc_worker.py sweep DSN INTERVAL_S GRACE_S
        Runs a Sweeper (which fires the schedules while it leads); prints
        "ready", and "leader" once it leads, then runs until it is killed.

Not a test module: the tests start it through ``Worker``, defined below.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

import batonq


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def drain(dsn: str, queue: str, batch: int, name: str) -> int:
    held: list[list[int]] = []
    refused: list[list[object]] = []
    with batonq.connect(dsn, min_connections=1, max_connections=1, listen=False, worker_name=name) as client:
        _say("ready")
        if sys.stdin.readline().strip() != "go":
            return 2
        while True:
            leases = client.claim(queue, max_tasks=batch)
            if not leases:
                break
            held += [[lease.task_id, lease.fencing_token] for lease in leases]
            if batch == 1:
                [lease] = leases
                try:
                    client.complete(lease.lease_token, {"by": name})
                except batonq.LeaseLost as lost:
                    refused.append([lease.task_id, lease.fencing_token, lost.state])
            else:
                replies = client.complete_many([(lease.lease_token, {"by": name}) for lease in leases])
                refused += [
                    [r.task_id, r.fencing_token, r.outcome] for r in replies if r.outcome != "accepted"
                ]
    _say(json.dumps({"name": name, "held": held, "refused": refused}))
    return 0


def hold(dsn: str, queue: str, lease_s: int, wait_s: float, name: str) -> int:
    with batonq.connect(dsn, poll_interval_s=0.1, worker_name=name) as client:
        _say("ready")
        leases = client.claim(queue, lease_s=lease_s, wait_s=wait_s)
        if not leases:
            _say(json.dumps(None))
            return 3
        [lease] = leases
        _say(json.dumps({"task_id": lease.task_id, "fencing_token": lease.fencing_token,
                         "attempt": lease.attempt}))  # fmt: skip
        # "Working": blocked until the test kills us (or closes our stdin).
        sys.stdin.read()
    return 0


def sweep(dsn: str, interval_s: float, grace_s: float) -> int:
    sweeper = batonq.Sweeper(dsn, interval_s=interval_s, schedule_grace_s=grace_s)
    sweeper.start()
    _say("ready")
    while not sweeper.is_leader:  # a standby polls until it leads (or is killed)
        time.sleep(0.05)
    _say("leader")
    sys.stdin.read()
    sweeper.stop()
    return 0


class Worker:
    """The test's side: one ``proc_worker.py`` process, its output read line
    by line with a deadline (a thread pumps stdout into a queue)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def read_line(self, timeout: float) -> str:
        """The next line the worker printed; fails the test after ``timeout``."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"worker printed nothing within {timeout} s") from None
        if line is None:
            assert self.proc.stderr is not None
            raise AssertionError(f"worker exited ({self.proc.wait()}): {self.proc.stderr.read()}")
        return line

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def sigkill(self) -> int:
        """SIGKILL the worker, mid-task; returns its exit status."""
        os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=10)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._pump.join(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def main(argv: list[str]) -> int:
    match argv:
        case ["drain", dsn, queue, batch, name]:
            return drain(dsn, queue, int(batch), name)
        case ["hold", dsn, queue, lease_s, wait_s, name]:
            return hold(dsn, queue, int(lease_s), float(wait_s), name)
        case ["sweep", dsn, interval_s, grace_s]:
            return sweep(dsn, float(interval_s), float(grace_s))
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
