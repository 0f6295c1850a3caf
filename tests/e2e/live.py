"""A real ``batonq serve`` process on loopback, for the end-to-end tests.

Started as a user starts it (``batonq --dsn DSN serve --port P``), waited for
through ``/readyz`` with a deadline, its first admin key read from stderr,
and stopped with SIGTERM (SIGKILL if it does not go).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from batonq.client import ENV_LISTEN_DSN

__all__ = [
    "ADMIN_KEY", "Event", "LiveServer", "Subscriber", "claim", "claim_one", "enqueue", "free_port", "new_key",
    "problem", "sse_events",
]  # fmt: skip

ADMIN_KEY = re.compile(r"\bbq_[0-9]+_[0-9a-f]{64}\b")
_BATONQ = Path(sys.executable).with_name("batonq")
START_TIMEOUT_S = 90.0  # a loaded machine has taken over 30 s to import and start


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LiveServer:
    """One ``batonq serve`` process. ``admin_key`` is the key it printed on
    its first start (None when the database already had keys)."""

    def __init__(
        self,
        dsn: str,
        *args: str,
        listen_dsn: str | None = None,
        launcher: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        """``listen_dsn``: $BATONQ_LISTEN_URL for the process (PostgreSQL
        itself when ``dsn`` is a pooler); by default the one it inherits.
        ``launcher``: the command that runs batonq (``opentelemetry-instrument``);
        ``env``: more environment."""
        self.dsn = dsn
        self.args = args
        listening = {ENV_LISTEN_DSN: listen_dsn} if listen_dsn else {}
        listening |= env or {}
        self.output: list[str] = []
        self._lock = threading.Lock()
        for attempt in range(3):  # a free port may be taken before the server binds it
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.proc = subprocess.Popen(
                [*launcher, str(_BATONQ), "--dsn", dsn, "serve", "--port", str(self.port), "--log-level",
                 "warning", *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **listening},
            )  # fmt: skip
            self._drainer = threading.Thread(target=self._drain, daemon=True)
            self._drainer.start()
            if self._wait_ready():
                break
            self.stop()
            if attempt == 2 or "address already in use" not in self.log.lower():
                raise RuntimeError(f"batonq serve did not become ready:\n{self.log}")
        found = ADMIN_KEY.search(self.log)
        self.admin_key = found.group(0) if found else None

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.output.append(line)

    @property
    def log(self) -> str:
        with self._lock:
            return "".join(self.output)

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(base_url=self.url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    if http.get("/readyz").status_code == 200:
                        return True
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        return False

    def http(self, key: str | None = None, **options: object) -> httpx.Client:
        """A keep-alive client on this server, sending ``key`` as the bearer."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, **options)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._drainer.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextmanager
def sse_events(
    http: httpx.Client, path: str, *, timeout: float = 30.0, headers: dict[str, str] | None = None
) -> Iterator[Iterator[tuple[str, str | None, str]]]:
    """Open an event stream; yields an iterator of ``(kind, id, data)``, where
    kind is the event name, or ``":"`` for a comment (data: its text)."""
    with http.stream("GET", path, timeout=httpx.Timeout(timeout, connect=5.0), headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")

        def events() -> Iterator[tuple[str, str | None, str]]:
            event, event_id, data = "message", None, []
            for line in response.iter_lines():
                if line.startswith(":"):
                    yield ":", None, line[1:].strip()
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("id:"):
                    event_id = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif line == "" and data:
                    yield event, event_id, "\n".join(data)
                    event, event_id, data = "message", None, []

        yield events()


def new_key(http: httpx.Client, ring: int, queues: list[str] | None = None) -> tuple[int, str]:
    """Make an API key through POST /v1/keys; returns its id and secret."""
    response = http.post("/v1/keys", json={"ring": ring, "queues": queues or ["*"], "name": f"ring {ring}"})
    assert response.status_code == 201, response.text
    made = response.json()
    return made["id"], made["key"]


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """Assert an error answer: the status, JSON, ``{"error": {"code", "message"}}``
    with ``code``; returns the error object."""
    assert response.status_code == status, f"{response.status_code} {response.text}"
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert isinstance(error.get("message"), str) and error["message"], body
    assert error.get("code") == code, body
    return error


def enqueue(http: httpx.Client, queue: str, payload: Any = None, **fields: Any) -> str:
    response = http.post("/v1/enqueue", json={"queue": queue, "payload": payload, **fields})
    assert response.status_code == 200, response.text
    task_id: str = response.json()["task_id"]
    return task_id


def claim(http: httpx.Client, queue: str, **fields: Any) -> list[dict[str, Any]]:
    """The tasks claimed: a list for ``max_tasks`` over 1, else the one task
    the answer is (none when its ``task_id`` is null)."""
    response = http.post("/v1/claim", json={"queue": queue, **fields})
    assert response.status_code == 200, response.text
    body = response.json()
    if fields.get("max_tasks", 1) > 1:
        tasks: list[dict[str, Any]] = body["tasks"]
        return tasks
    assert "tasks" not in body, body
    return [body] if body["task_id"] is not None else []


def claim_one(http: httpx.Client, queue: str, **fields: Any) -> dict[str, Any]:
    tasks = claim(http, queue, **fields)
    assert len(tasks) == 1, tasks
    return tasks[0]


@dataclass(frozen=True)
class Event:
    at: float
    """time.monotonic() when it arrived"""
    kind: str
    """the event name, ":" for a comment, "closed" when the stream ended"""
    id: str | None
    data: str


class Subscriber:
    """Reads ``GET path`` as an event stream in a thread of its own; events
    arrive in ``events`` with their arrival time. ``close()`` drops the
    connection (within a keep-alive interval)."""

    def __init__(self, server: LiveServer, key: str | None, path: str, headers: dict[str, str] | None = None):
        self.events: queue.Queue[Event] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, key, path, headers), daemon=True)
        self._thread.start()

    def _run(self, server: LiveServer, key: str | None, path: str, headers: dict[str, str] | None) -> None:
        try:
            with server.http(key) as http, sse_events(http, path, headers=headers) as events:
                for kind, event_id, data in events:
                    self.events.put(Event(time.monotonic(), kind, event_id, data))
                    if self._stop.is_set():
                        return
        except Exception as error:
            self.events.put(Event(time.monotonic(), "error", None, repr(error)))
        finally:
            self.events.put(Event(time.monotonic(), "closed", None, ""))

    def next(self, kind: str, timeout: float, data: str | None = None) -> Event:
        """The next event of ``kind`` (and, for a comment, text ``data``),
        skipping others; fails on the deadline or the end of the stream."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {kind!r} event within {timeout} s") from None
            if event.kind == kind and (data is None or event.data == data):
                return event
            if event.kind in ("closed", "error"):
                raise AssertionError(f"the stream ended before a {kind!r} event: {event}")

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the subscriber did not stop"
