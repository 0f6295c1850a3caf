"""Talos-Queue in its own words: its README's quickstart runs through
batonq.talos with only the import line and the connection changed, on a
schema made by ``batonq migrate`` and on one made by ``psql -f
sql/batonq.sql``; and what that README promises of ``enqueue``,
``set_stage`` and ``run_worker`` holds."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool
from tests.conftest import WORKER_ROLE, scratch_database, through_pooler, with_db
from tests.deployed import pgbouncer
from tests.waiting import wait_for
from tests.worker.support import eventually_async

import batonq
from batonq.client import ENV_LISTEN_DSN
from batonq.talos import EnqueuedJob, LeaseQueue, PermanentError, run_worker

ROOT = Path(__file__).resolve().parents[2]
SEED = Path("/work/shared/seeds/004_b7514dc4f9a797ae.txt")
SQL_FILE = ROOT / "sql" / "batonq.sql"

IMPORT = "from pgleasequeue import LeaseQueue, PermanentError, run_worker\n"
CONNECTION = [
    "from supabase import create_client\n",
    'supabase = create_client("https://xyz.supabase.co", "SERVICE_ROLE_KEY")\n',
]


def seed_quickstart() -> str:
    """The quickstart's program as the seed's README writes it."""
    text = SEED.read_text(encoding="utf-8")
    section = text[text.index("🚀 Quickstart") :]
    start = section.index("import asyncio\n")
    end = section.index("asyncio.run(main())\n") + len("asyncio.run(main())\n")
    return section[start:end]


def batonq_quickstart(dsn: str) -> str:
    """The same program with its import line and its connection changed."""
    program = seed_quickstart()
    assert IMPORT in program and all(line in program for line in CONNECTION)
    program = program.replace(IMPORT, "from batonq.talos import LeaseQueue, PermanentError, run_worker\n")
    program = program.replace(CONNECTION[0], "")
    return program.replace(CONNECTION[1], f"supabase = {dsn!r}  # a PostgreSQL URL\n")


@pytest.fixture(params=["batonq migrate", "psql -f sql/batonq.sql", "through a transaction pooler"])
def schema_dsn(
    request: pytest.FixtureRequest, server_dsn: str, template_db: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A new database whose schema was made one way or the other; the
    worker role's DSN (the role is made with the template database). Through
    a transaction-mode PgBouncer (as Supabase's transaction pooler), with
    ``$BATONQ_LISTEN_URL`` naming the database itself for wake-ups, as
    docs/supabase.md says."""
    with scratch_database(server_dsn, "batonq_talos") as owner_dsn:
        if request.param == "psql -f sql/batonq.sql":
            done = subprocess.run(
                ["psql", "-v", "ON_ERROR_STOP=1", "-q", "-d", owner_dsn, "-f", str(SQL_FILE)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        else:
            batonq.migrate(owner_dsn)
        direct = with_db(owner_dsn, conninfo_to_dict(owner_dsn)["dbname"], user=WORKER_ROLE)
        if request.param != "through a transaction pooler":
            yield direct
            return
        with pgbouncer(server_dsn) as address:
            monkeypatch.setenv(ENV_LISTEN_DSN, direct)
            yield through_pooler(direct, address)


def test_only_the_import_line_and_the_connection_change() -> None:
    seed, ours = seed_quickstart(), batonq_quickstart("postgresql://app@db/mydb")
    changed = [
        line
        for line in difflib.ndiff(seed.splitlines(keepends=True), ours.splitlines(keepends=True))
        if line[0] in "+-"
    ]
    assert sorted(changed) == sorted(
        [
            "- " + CONNECTION[0],
            "- " + IMPORT,
            "+ from batonq.talos import LeaseQueue, PermanentError, run_worker\n",
            "- " + CONNECTION[1],
            "+ supabase = 'postgresql://app@db/mydb'  # a PostgreSQL URL\n",
        ]
    )


def test_the_seed_quickstart_runs(schema_dsn: str, tmp_path: Path) -> None:
    program = tmp_path / "quickstart.py"
    program.write_text(batonq_quickstart(schema_dsn), encoding="utf-8")
    with LeaseQueue(schema_dsn) as queue:
        bad = queue.enqueue(kind="transcode", payload={"target_format": "aac"})
        log_path = tmp_path / "quickstart.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-u", str(program)], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        try:

            def finished(task_id: int) -> batonq.Task | None:
                task = queue.client.task(task_id)
                return task if task.state in ("done", "dead") else None

            dead = wait_for(lambda: finished(bad.id), timeout=30, what="the bad job failed")
            [job] = wait_for(lambda: queue.client.tasks("transcode", state="done"), timeout=30, what="done")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0, log_path.read_text(encoding="utf-8")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        output = log_path.read_text(encoding="utf-8")
    assert (job.payload, job.attempts) == ({"video_id": 892, "target_format": "aac"}, 1)
    assert job.result == {"status": "success", "file_url": "https://storage.com/892.mp4"}
    assert (job.stage, job.worker) == ("encoding", "worker-1")
    assert (dead.state, dead.attempts) == ("dead", 1)
    assert dead.last_error is not None
    assert dead.last_error.startswith("PermanentError: Invalid payload: missing video_id")
    assert f"Processing job {job.id}: {{'video_id': 892, 'target_format': 'aac'}}" in output


def test_the_same_kind_and_dedupe_key_while_active_is_the_same_job(
    client: batonq.Client, admin: batonq.Client, dsn: str
) -> None:
    with LeaseQueue(dsn) as queue:
        first = queue.enqueue(
            kind="transcode", dedupe_key="video:892", payload={"video_id": 892}, priority=100
        )
        again = queue.enqueue(kind="transcode", dedupe_key="video:892", payload={"video_id": 0})
        other_kind = queue.enqueue(kind="thumbnail", dedupe_key="video:892", payload={"video_id": 892})
        assert isinstance(first, EnqueuedJob)
        assert (first.created, again.created, again.id) == (True, False, first.id)
        assert other_kind.created and other_kind.id != first.id
        assert client.task(first.id).payload == {"video_id": 892}  # the first job's, unchanged

        [lease] = client.claim("transcode")
        claimed = queue.enqueue(kind="transcode", dedupe_key="video:892", payload={})
        assert (claimed.created, claimed.id, claimed.state) == (False, first.id, "leased")
        client.fail(lease.lease_token, "try again")  # retrying: still active
        assert queue.enqueue(kind="transcode", dedupe_key="video:892", payload={}).id == first.id

        admin.cancel(first.id)  # finished: the key enqueues anew
        fresh = queue.enqueue(kind="transcode", dedupe_key="video:892", payload={"video_id": 893})
        assert fresh.created and fresh.id != first.id
        assert queue.enqueue(kind="transcode", dedupe_key="video:892", payload={}).id == fresh.id

        [lease] = client.claim("transcode")
        client.complete(lease.lease_token, {"status": "success"})  # done: anew again
        after_done = queue.enqueue(kind="transcode", dedupe_key="video:892", payload={"video_id": 894})
        assert after_done.created and after_done.id not in (first.id, fresh.id)
        assert [client.task(i).state for i in (first.id, fresh.id)] == ["cancelled", "done"]


def test_two_enqueues_at_once_after_the_job_finished_make_one_new_job(
    client: batonq.Client, admin_dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """Both find the finished job's key: the first to let it go makes the
    new job, the other waits for it and returns that job."""
    call = "SELECT task_id, created FROM batonq.enqueue_deduped('transcode', '{}', 'video:892')"
    first = client.enqueue("transcode", {}, dedupe_key="video:892")
    [lease] = client.claim("transcode")
    client.complete(lease.lease_token, None)
    with psycopg.connect(admin_dsn) as a, psycopg.connect(admin_dsn, autocommit=True) as b:
        a_row = a.execute(call).fetchone()  # in a transaction, not committed yet
        b_pid = b.info.backend_pid
        b_rows: list[tuple[Any, ...] | None] = []
        b_call = threading.Thread(target=lambda: b_rows.append(b.execute(call).fetchone()))
        b_call.start()
        wait_for(
            lambda: (
                sql.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (b_pid,)
                ).fetchone()
                == (True,)
            ),
            timeout=10,
            what="the second enqueue waits on the first",
        )
        a.commit()
        b_call.join(10)
    assert a_row is not None and a_row[0] != first.task_id and a_row[1] is True
    assert b_rows == [(a_row[0], False)]
    assert [t.id for t in client.tasks("transcode", state="pending")] == [a_row[0]]


def test_bad_arguments_get_batonq_errors(dsn: str) -> None:
    with LeaseQueue(dsn) as queue:
        with pytest.raises(batonq.InvalidQueueName):
            queue.enqueue(kind="Trans Code", payload={})
        with pytest.raises(batonq.InvalidArgument, match="dedupe_key must be a string"):
            queue.enqueue(kind="transcode", dedupe_key=892, payload={})  # type: ignore[arg-type]
        with pytest.raises(batonq.InvalidArgument, match="not running under worker 'worker-1'"):
            queue.set_stage(1, worker_id="worker-1", stage="encoding")
    with pytest.raises(TypeError, match="a PostgreSQL URL, a psycopg pool or a batonq client; got int"):
        LeaseQueue(5432)  # type: ignore[arg-type]


def test_a_pool_or_a_batonq_client_connects_it(dsn: str) -> None:
    with ConnectionPool(dsn, open=True) as pool, LeaseQueue(pool) as queue:
        assert queue.enqueue(kind="transcode", payload={"via": "pool"}).created
    with batonq.connect(dsn) as client:
        queue = LeaseQueue(client)
        job = queue.enqueue(kind="transcode", payload={"via": "client"})
        assert queue.client is client
        queue.close()  # leaves a given client open
        assert client.task(job.id).payload == {"via": "client"}


async def _working(
    queue: LeaseQueue, handler: Callable[..., Any], until: Callable[[], Awaitable[Any]], **options: Any
) -> Any:
    """Run the worker until ``until`` returns something, then cancel it."""
    running = asyncio.create_task(
        run_worker(queue, handler, worker_id="worker-1", handle_signals=False, **options)
    )
    try:
        return await eventually_async(until, timeout=30)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_a_job_longer_than_its_lease_is_not_taken_over(aclient: batonq.AsyncClient, dsn: str) -> None:
    with LeaseQueue(dsn) as queue:
        job = queue.enqueue(kind="transcode", payload={"video_id": 1})
        stolen: list[batonq.Lease] = []

        async def process_job(job: Any) -> dict[str, str]:
            queue.set_stage(job.id, worker_id="worker-1", stage="encoding")
            for _ in range(8):  # 4 s, under a 1 s lease; others keep trying to claim
                stolen.extend(await aclient.claim("transcode"))
                await asyncio.sleep(0.5)
            return {"status": "success"}

        async def done() -> batonq.Task | None:
            task = await aclient.task(job.id)
            return task if task.state == "done" else None

        task = await _working(queue, process_job, done, kind="transcode", lease_s=1)
    assert stolen == []
    assert (task.attempts, task.result, task.stage) == (1, {"status": "success"}, "encoding")


async def test_a_stale_result_is_discarded_when_the_lease_was_lost(
    aclient: batonq.AsyncClient, sql: psycopg.Connection[Any], dsn: str
) -> None:
    started, go_on = threading.Event(), threading.Event()
    lost: list[BaseException] = []

    def process_job(job: Any) -> dict[str, str]:  # a plain function runs in a thread
        started.set()
        go_on.wait(30)
        try:
            queue.set_stage(job.id, worker_id="worker-1", stage="uploading")
        except batonq.LeaseLost as error:
            lost.append(error)
        return {"status": "stale"}

    with LeaseQueue(dsn) as queue:
        job = queue.enqueue(kind="transcode", payload={"video_id": 2})

        async def steal_then_refused() -> list[batonq.SetAsideWrite] | None:
            if not started.is_set():
                return None
            if not go_on.is_set():
                with sql.transaction():  # the lease runs out; another worker claims the job
                    sql.execute(
                        "UPDATE batonq.tasks SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
                        (job.id,),
                    )
                    assert sql.execute("SELECT * FROM batonq.claim('transcode', 'worker-2')").fetchall()
                go_on.set()
            refused = await aclient.set_aside_writes([job.id])
            return [w for w in refused if w.kind == "complete"] or None

        [refused] = await _working(queue, process_job, steal_then_refused, kind="transcode")
    task = await aclient.task(job.id)
    assert (task.state, task.worker, task.result) == ("leased", "worker-2", None)
    assert refused.worker == "worker-1"
    assert [type(e) for e in lost] == [batonq.LeaseLost]


async def test_permanent_error_fails_at_once_and_others_retry_until_max_attempts(
    admin: batonq.Client, aclient: batonq.AsyncClient, dsn: str
) -> None:
    admin.configure_queue("transcode", backoff_base_s=0.1, backoff_max_s=0.2)
    with LeaseQueue(dsn) as queue:
        permanent = queue.enqueue(kind="transcode", payload={"fail": "permanent"})
        flaky = queue.enqueue(kind="transcode", payload={"fail": "flaky"}, max_attempts=3)

        async def process_job(job: Any) -> str:
            if job.payload["fail"] == "permanent":
                raise PermanentError("Invalid payload: missing video_id")
            raise ConnectionError(f"storage unreachable (attempt {job.attempt})")

        async def both_dead() -> list[batonq.Task] | None:
            tasks = [await aclient.task(permanent.id), await aclient.task(flaky.id)]
            return tasks if all(t.state == "dead" for t in tasks) else None

        first, second = await _working(queue, process_job, both_dead, kind="transcode")
    assert first.attempts == 1 and first.last_error is not None
    assert first.last_error.startswith("PermanentError: Invalid payload: missing video_id")
    assert second.attempts == 3 and second.last_error is not None
    assert second.last_error.startswith("ConnectionError: storage unreachable (attempt 3)")
    assert [e["error"].split("\n")[0] for e in second.errors] == [
        f"ConnectionError: storage unreachable (attempt {n})" for n in (1, 2, 3)
    ]
