"""The fault battery's harness: a batonq database on the private cluster,
worker processes running ``chaos_app``, an enqueuer that keeps a history of
every call, and the invariants checked once the queue has drained.

The invariants (DESIGN.md's guarantees as checks on what happened):

- no loss: every acknowledged enqueue ends ``done`` or ``dead``;
- one acceptance per task, carrying the newest token granted before it: a
  done task's token is the greatest any worker was handed for it, greater
  than every earlier attempt's, and every ``ok`` a worker was told is that one;
- tokens grow per task, one per attempt, and attempts <= max_attempts;
- exactly the right batons: one ``chaos:b`` task per done ``chaos:a`` task,
  whose payload is that completion's result (no orphan, no phantom);
- the handler ran under the accepted token (its effect row exists);
- one task per idempotency key;
- liveness: the drain ends within lease + two sweeps + 30 s of the last fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tests.chaos.cluster import WORKER_ROLE, Cluster
from tests.e2e.live import LiveServer

import batonq

ROOT = Path(__file__).resolve().parents[2]
A, B = "chaos:a", "chaos:b"
SWEEP_S = 1.0  # the sweeper's interval in every worker


def as_role(dsn: str, user: str) -> str:
    params = conninfo_to_dict(dsn)
    params["user"] = user
    return make_conninfo(**params)


class Database:
    """A fresh migrated database on the cluster, with the effect table and
    the edge ``chaos:a -> chaos:b``."""

    def __init__(self, cluster: Cluster, max_attempts: int = 10) -> None:
        self.cluster = cluster
        self.name = f"chaos_{uuid.uuid4().hex[:10]}"
        self.owner_dsn = cluster.create_database(self.name)
        self.dsn = as_role(self.owner_dsn, WORKER_ROLE)
        self.max_attempts = max_attempts
        self.sql("CREATE TABLE chaos_effects (task_id bigint, fencing_token bigint, worker text,"
                 " at timestamptz DEFAULT clock_timestamp())")  # fmt: skip
        with batonq.connect(self.owner_dsn) as admin:
            admin.add_edge(A, B)

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.owner_dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def unfinished(self) -> int:
        return int(self.sql("SELECT count(*) FROM batonq.tasks")[0][0])


class WorkerProcess:
    """``batonq worker tests.chaos.chaos_app:app`` with ``slots`` handlers at once."""

    def __init__(self, db: Database, name: str, workdir: Path, *, slots: int = 4, lease_s: int = 2,
                 dsn: str | None = None, env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.name = name
        self.history = workdir / f"{name}.jsonl"
        self.log = workdir / f"{name}.log"
        environ = {**os.environ, "CHAOS_HISTORY": str(self.history), "CHAOS_EFFECTS_DSN": db.owner_dsn,
                   "CHAOS_NAME": name, **(env or {})}  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "batonq", "worker", "tests.chaos.chaos_app:app",
                 "--concurrency", str(slots), "--lease", str(lease_s), "--wait", "1", "--grace", "5",
                 "--name", name, "--dsn", dsn or db.dsn, "--log-level", "warning"],
                cwd=ROOT, env=environ, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )  # fmt: skip

    def sigkill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.sigkill()

    def alive(self) -> bool:
        return self.proc.poll() is None


class Fleet:
    """Several worker processes; killed ones are replaced by new ones."""

    def __init__(self, db: Database, workdir: Path, count: int, **options: Any) -> None:
        self.db, self.workdir, self.options = db, workdir, options
        self.started: list[WorkerProcess] = []
        self.live: list[WorkerProcess] = [self.spawn() for _ in range(count)]
        self.kills = 0

    def spawn(self, **options: Any) -> WorkerProcess:
        worker = WorkerProcess(
            self.db, f"w{len(self.started) + 1}", self.workdir, **{**self.options, **options}
        )
        self.started.append(worker)
        return worker

    def kill_one(self) -> WorkerProcess:
        victim = self.live.pop(random.randrange(len(self.live)))
        victim.sigkill()
        self.kills += 1
        self.live.append(self.spawn())
        return victim

    def stop(self) -> None:
        for worker in self.live:
            worker.stop()
        for worker in self.started:
            if worker.alive():
                worker.sigkill()

    def history(self) -> list[dict[str, Any]]:
        events = []
        for worker in self.started:
            if worker.history.exists():
                for line in worker.history.read_text().splitlines():
                    with contextlib.suppress(json.JSONDecodeError):  # a line cut by SIGKILL
                        events.append(json.loads(line))
        return events

    def crashed(self) -> list[str]:
        """Workers that exited on their own (not killed, not stopped): a worker must ride out faults."""
        return [f"{w.name} exited {w.proc.returncode}: {w.log.read_text()[-2000:]}"
                for w in self.live if not w.alive()]  # fmt: skip


@dataclass
class Call:
    """One operation in the history: invoked, then ok / failed / unknown."""

    op: str
    key: str
    outcome: str = "invoked"
    answer: Any = None
    error: str = ""


@dataclass
class Enqueuer:
    """Enqueues ``chaos:a`` tasks with idempotency keys from threads, each
    call in the history; a call that fails with its outcome unknown (the
    connection broke) is retried with the same key until it is answered."""

    db: Database
    max_attempts: int = 10
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enqueue(self, client: batonq.Client, key: str, n: int, deadline: float) -> batonq.Enqueued:
        while True:
            call = Call("enqueue", key)
            with self.lock:
                self.calls.append(call)
            try:
                answer = client.enqueue(A, {"n": n}, idempotency_key=key, max_attempts=self.max_attempts)
            except (batonq.BatonqError, psycopg.Error, OSError) as error:
                # A broken connection leaves the outcome unknown; anything else failed.
                call.outcome = "unknown" if _connection_level(error) else "failed"
                call.error = f"{type(error).__name__}: {error}"
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
                continue
            call.outcome, call.answer = "ok", answer.task_id
            return answer

    def run(self, keys: list[str], threads: int, copies: int = 1, deadline_s: float = 180) -> None:
        """Every key ``copies`` times: ``threads`` threads, each with its own
        client, share the keys; with ``copies`` > 1, each of ``copies`` threads
        enqueues every key, in its own random order (racing enqueues)."""
        deadline = time.monotonic() + deadline_s

        def worker(part: list[str]) -> None:
            with batonq.connect(self.db.dsn, min_connections=1, max_connections=1, listen=False) as client:
                for key in part:
                    self.enqueue(client, key, int(key.rsplit("-", 1)[1]), deadline)

        if copies > 1:
            parts = [random.sample(keys, len(keys)) for _ in range(copies)]
        else:
            parts = [keys[i::threads] for i in range(threads)]
        run_threads([lambda p=part: worker(p) for part in parts])

    def acknowledged(self) -> dict[str, set[int]]:
        """Each key's task ids as answered by ok calls (one per key, if idempotent)."""
        ids: dict[str, set[int]] = defaultdict(set)
        for call in self.calls:
            if call.outcome == "ok":
                ids[call.key].add(call.answer)
        return ids

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for call in self.calls:
            counts[call.outcome] += 1
        return dict(counts)


def _connection_level(error: BaseException) -> bool:
    return isinstance(error, psycopg.OperationalError | OSError) or isinstance(
        error.__cause__, psycopg.OperationalError
    )


def run_threads(targets: list[Any]) -> None:
    """Run callables in threads; re-raise the first error."""
    errors: list[BaseException] = []

    def guarded(target: Any) -> None:
        try:
            target()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@contextlib.contextmanager
def ticking(every_s: float, action: Any) -> Iterator[list[float]]:
    """Call ``action`` every ``every_s`` seconds in a thread until the block
    ends; yields the list of times (monotonic) a fault was done."""
    stop = threading.Event()
    faults: list[float] = []

    def loop() -> None:
        while not stop.wait(every_s):
            action()
            faults.append(time.monotonic())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield faults
    finally:
        stop.set()
        thread.join(timeout=60)


def drain(db: Database, *, since: float, lease_s: float, what: str = "the drain") -> float:
    """Wait until no task is unfinished; fail unless that happens within
    lease + two sweeps + 30 s of ``since`` (the last fault). Returns when it ended."""
    budget = lease_s + 2 * SWEEP_S + 30
    deadline = since + budget
    while db.unfinished():
        if time.monotonic() > deadline:
            rows = db.sql("SELECT queue, state, count(*) FROM batonq.tasks GROUP BY 1, 2")
            raise AssertionError(f"{what}: still unfinished {budget:.0f} s after the last fault: {rows}")
        time.sleep(0.2)
    return time.monotonic()


def _tasks(db: Database) -> list[dict[str, Any]]:
    rows = db.sql(
        """SELECT id, queue, state, attempts, max_attempts, fencing_token, errors, idempotency_key,
                  parent_id, payload, result FROM batonq.archive
           UNION ALL
           SELECT id, queue, state, attempts, max_attempts, fencing_token, errors, idempotency_key,
                  parent_id, payload, NULL FROM batonq.tasks"""
    )
    cols = ("id", "queue", "state", "attempts", "max_attempts", "fencing_token", "errors", "key",
            "parent_id", "payload", "result")  # fmt: skip
    return [dict(zip(cols, row, strict=True)) for row in rows]


def _keys(tasks: list[dict[str, Any]], enqueuer: Enqueuer | None) -> list[str]:
    """One task per idempotency key; no loss; every answer for a key named the same task."""
    by_id = {t["id"]: t for t in tasks}
    per_key: dict[tuple[str, str], list[int]] = defaultdict(list)
    for t in tasks:
        if t["key"] is not None:
            per_key[(t["queue"], t["key"])].append(t["id"])
    problems = [f"key {k}: tasks {ids}" for k, ids in per_key.items() if len(ids) > 1]
    for key, ids in (enqueuer.acknowledged() if enqueuer else {}).items():
        if len(ids) != 1:
            problems.append(f"key {key} answered with tasks {sorted(ids)}")
        for task_id in ids:
            if task_id not in by_id:
                problems.append(f"acknowledged t_{task_id} ({key}) is lost")
            elif by_id[task_id]["state"] not in ("done", "dead"):
                problems.append(f"t_{task_id} ended {by_id[task_id]['state']}")
    return problems


def _tokens(t: dict[str, Any]) -> list[str]:
    """One token per attempt, growing; attempts <= max. A lease that ran out on
    a task nobody claimed since may still be completed or failed by its holder:
    then that attempt's token appears again after its "lease expired"."""
    tokens = [e["fencing_token"] for e in t["errors"]]
    if t["state"] == "done":
        tokens.append(t["fencing_token"])
    problems = []
    if tokens != sorted(tokens):
        problems.append(f"t_{t['id']}: tokens not increasing per attempt: {tokens}")
    if t["state"] in ("done", "dead") and len(set(tokens)) != t["attempts"]:
        problems.append(f"t_{t['id']}: {t['attempts']} attempts but tokens {tokens}")
    if t["attempts"] > t["max_attempts"]:
        problems.append(f"t_{t['id']}: {t['attempts']} attempts > max {t['max_attempts']}")
    return problems


def _acceptance(tasks: list[dict[str, Any]], history: list[dict[str, Any]]) -> list[str]:
    """The accepted token is the newest granted, and the only one a worker was told ok for."""
    granted: dict[int, set[int]] = defaultdict(set)
    told_ok: dict[int, set[int]] = defaultdict(set)
    for event in history:
        granted[event["task"]].add(event["token"])
        if event["event"] == "ok":
            told_ok[event["task"]].add(event["token"])
    problems = []
    for t in tasks:
        problems += _tokens(t)
        token = t["fencing_token"]
        if t["state"] != "done":
            if t["id"] in told_ok:
                problems.append(f"t_{t['id']}: a worker was told ok but the task is {t['state']}")
            continue
        if t["id"] in granted and token != max(granted[t["id"]]):
            problems.append(f"t_{t['id']}: accepted token {token}, newest granted {max(granted[t['id']])}")
        if told_ok.get(t["id"], {token}) != {token}:
            problems.append(f"t_{t['id']}: workers told ok for {told_ok[t['id']]}, accepted {token}")
    return problems


def _batons(db: Database, tasks: list[dict[str, Any]]) -> list[str]:
    """The handler's effect under each accepted token; one baton per accepted
    completion, carrying its result; no baton without one."""
    effects = set(db.sql("SELECT task_id, fencing_token FROM chaos_effects"))
    children: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in tasks:
        if t["queue"] == B:
            children[t["parent_id"]].append(t)
    problems = []
    for t in tasks:
        if t["queue"] != A or t["state"] != "done":
            continue
        if (t["id"], t["fencing_token"]) not in effects:
            problems.append(f"t_{t['id']}: no effect under the accepted token {t['fencing_token']}")
        batons = [b["payload"] for b in children.pop(t["id"], [])]
        if batons != [t["result"]]:
            problems.append(f"t_{t['id']}: batons {batons} for result {t['result']}")
    return problems + [f"phantom baton(s) {[b['id'] for b in bs]} of t_{p}" for p, bs in children.items()]


def check_invariants(
    db: Database, enqueuer: Enqueuer | None, history: list[dict[str, Any]]
) -> dict[str, int]:
    """Every invariant of the module docstring; returns counts for the report."""
    tasks = _tasks(db)
    problems = _keys(tasks, enqueuer) + _acceptance(tasks, history) + _batons(db, tasks)
    assert not problems, f"{len(problems)} invariant violations, first ones:\n" + "\n".join(problems[:20])
    a_tasks = [t for t in tasks if t["queue"] == A]
    return {
        "tasks": len(a_tasks),
        "done": sum(t["state"] == "done" for t in a_tasks),
        "dead": sum(t["state"] == "dead" for t in a_tasks),
        "batons": sum(t["queue"] == B for t in tasks),
        "attempts": sum(t["attempts"] for t in a_tasks),
        "handler_runs": sum(e["event"] == "invoked" and e["queue"] == A for e in history),
        "unknown_outcomes": _unknown(history),
        "refused": int(db.sql("SELECT count(*) FROM batonq.submits WHERE outcome = 'set_aside'")[0][0]),
    }


def _unknown(history: list[dict[str, Any]]) -> int:
    """Jobs invoked that never reported an outcome (their worker was killed), or reported ``unknown``."""
    ends = {(e["worker"], e["task"], e["token"]) for e in history if e["event"] != "invoked"}
    cut = sum((e["worker"], e["task"], e["token"]) not in ends for e in history if e["event"] == "invoked")
    return cut + sum(e["event"] == "unknown" for e in history)


def report(name: str, figures: dict[str, Any]) -> None:
    """One line per scenario on stdout (``pytest -s``) and in $CHAOS_REPORT, for docs/reliability.md."""
    line = json.dumps({"scenario": name, **figures}, default=str)
    print(line)
    path = os.environ.get("CHAOS_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")


class Service(LiveServer):
    """``batonq serve`` on the battery's database, logging every request;
    ``key`` is the admin key it printed on its first start."""

    def __init__(self, db: Database, *args: str) -> None:
        super().__init__(db.owner_dsn, "--log-level", "info", *args)
        assert self.admin_key, self.log
        self.key: str = self.admin_key

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


def done_count(db: Database) -> int:
    return int(db.sql("SELECT count(*) FROM batonq.archive WHERE queue = %s AND state = 'done'", (A,))[0][0])


class Proxy:
    """A loopback TCP proxy to the cluster, whose traffic can be frozen (held,
    both ways, the sockets left open) and thawed."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                self.flowing.wait()
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def dsn(self, dsn: str) -> str:
        params = conninfo_to_dict(dsn)
        params["port"] = str(self.port)
        return make_conninfo(**params)

    def close(self) -> None:
        self._closed = True
        self.flowing.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()
        self._accepting.join(timeout=10)
        for sock in self._sockets:
            sock.close()
