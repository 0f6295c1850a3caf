#!/usr/bin/env python3
"""The hot table's design under sustained mixed load, at the SQL level.

Each design is a small schema (16 hash partitions by queue, like
batonq.tasks, and an archive) with a claim and a complete_many written as
the engine writes them (PL/pgSQL, generic plans, fencing tokens from one
sequence, a lease secret per claim, finished rows copied to the archive).
A producer keeps about 4,000 tasks pending with batches of 128; consumers
claim 32 at a time and complete what they claimed in one call; a
maintenance thread does once a second what the design needs in the
background. Autovacuum is on at PostgreSQL's defaults and nothing else
vacuums.

Designs:

- ``today``: batonq's hot table. The claim UPDATE moves the row out of the
  partial claim index (state = 'pending') into the partial lease index
  (state = 'leased'): never HOT. complete DELETEs the row.
- ``hot``: no index reads a column the claim writes (the claim index is
  not partial, there is no lease index, fillfactor 50), so the claim
  UPDATE and heartbeats are HOT, pruned on the page without VACUUM.
  Expired leases are found by a scan of the queue's rows by the
  maintenance thread (no index can find them without making the claim
  non-HOT). complete DELETEs the row.
- ``leases``: the claim never writes the task row: it inserts a lease row
  (a small table of its own, indexed by expiry) and picks tasks that have
  none. complete DELETEs the task and its lease. With no write on the task
  row, two claims can pick the same task; the lease's primary key makes
  the later one wait and skip it, and complete must lock the task rows
  before it deletes their leases, or a claim and a complete deadlock.
- ``rotate``: PgQ's idea. Tasks go into one of two generations (a level of
  list partitions); complete marks the row done in place and copies it to
  the archive; every few seconds inserts move to the other generation, and
  an old generation whose rows are all finished is emptied by TRUNCATE, so
  no finished or dead row waits for VACUUM.
- ``rotate_named``: rotate with every statement naming its generation's
  table (one set of statements per generation, the draining one read
  first), so a plan locks only the generations it reads; the draining
  generation is locked, found empty of live rows and truncated in one
  transaction.
- ``append``: the floor, PgQ's consumer model with no per-task state:
  events are only appended, consumers take the ids after a cursor row and
  copy what they finished to the archive. No fencing, retries or
  priorities; not a design batonq can take, a measure of what per-task
  leases cost.

Per design it reports tasks/s (and against ``today`` in the same run),
database CPU per task (every process of the private cluster), dead row
versions per task (updates not HOT plus deletes, what only VACUUM or
TRUNCATE reclaims), the most dead rows seen at once, and WAL bytes per task.

    .venv/bin/python bench/bench_hot_table.py --seconds 90 --rounds 2
    .venv/bin/python bench/bench_hot_table.py --designs today,hot --seconds 20
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from bench_sustained import cluster_cpu_s, private_cluster, truncate_if_drained
from psycopg.types.json import Jsonb

from batonq.benchmark.environment import git_commit, machine_info, with_db

BENCH = Path(__file__).resolve().parent
QUEUE = "bench:hot"
PENDING = 4_000
BATCH = 128
CLAIM = 32
CONSUMERS = 2
ROTATE_S = 5.0

# --------------------------------------------------------------------------
# The designs: a schema and the functions each one needs.

COLUMNS = """
    id               bigint NOT NULL DEFAULT nextval('task_id_seq'),
    queue            text NOT NULL,
    state            text NOT NULL DEFAULT 'pending',
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 3,
    fencing_token    bigint,
    lease_secret     uuid,
    lease_expires_at timestamptz,
    claimed_at       timestamptz,
    worker           text
"""

COMMON = f"""
CREATE SEQUENCE task_id_seq;
CREATE SEQUENCE fencing_seq;
CREATE TABLE archive ({COLUMNS}, result jsonb, finished_at timestamptz NOT NULL DEFAULT now())
    PARTITION BY RANGE (finished_at);
CREATE TABLE archive_default PARTITION OF archive DEFAULT;
CREATE INDEX archive_id_idx ON archive (id);
"""


def _hash_partitions(parent: str, storage: str = "") -> str:
    return "\n".join(
        f"CREATE TABLE {parent}_p{i:02} PARTITION OF {parent}"
        f" FOR VALUES WITH (MODULUS 16, REMAINDER {i}) {storage};"
        for i in range(16)
    )


# The claim as the engine writes it: the queue named on every reference to
# the partitioned table, ids picked in a materialized CTE.
CLAIM_UPDATE = """
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT id FROM tasks
         WHERE queue = p_queue AND state = 'pending' AND run_at <= now()
         ORDER BY priority DESC, run_at, id
         LIMIT p_max FOR UPDATE SKIP LOCKED
    )
    UPDATE tasks t SET state = 'leased', attempts = t.attempts + 1,
           fencing_token = nextval('fencing_seq'), lease_secret = gen_random_uuid(),
           lease_expires_at = now() + interval '300 s', claimed_at = now(), worker = p_worker
     WHERE t.queue = p_queue AND t.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING t.id, t.fencing_token, t.lease_secret, t.payload;
"""

CLAIM_FUNCTION = """
CREATE FUNCTION claim(p_queue text, p_worker text, p_max integer)
RETURNS TABLE (id bigint, fencing_token bigint, lease_secret uuid, payload jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
BEGIN
    {expiry}
    {claim}
END $$;
"""

# complete_many as the engine writes it: each input row probes the primary key.
COMPLETE_DELETE = """
CREATE FUNCTION complete_many(p_queue text, p_ids bigint[], p_tokens bigint[], p_secrets uuid[])
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = auto SET jit = off AS $$
DECLARE
    v_n integer;
BEGIN
    WITH input AS MATERIALIZED (
        SELECT * FROM unnest(p_ids, p_tokens, p_secrets) AS u(id, fence, secret)
    ), moved AS (
        DELETE FROM tasks t USING input i
         WHERE t.queue = p_queue AND t.id = i.id AND t.fencing_token = i.fence
           AND t.lease_secret = i.secret AND t.state IN ('leased', 'pending')
        RETURNING t.*
    ), archived AS (
        INSERT INTO archive SELECT m.*, '{"ok": true}'::jsonb, now() FROM moved m RETURNING 1
    )
    SELECT count(*) INTO v_n FROM archived;
    RETURN v_n;
END $$;
"""

TODAY = f"""
{COMMON}
CREATE TABLE tasks ({COLUMNS}, PRIMARY KEY (id, queue)) PARTITION BY HASH (queue);
{_hash_partitions("tasks")}
CREATE INDEX tasks_claim_idx ON tasks (queue, priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX tasks_lease_idx ON tasks (queue, lease_expires_at) WHERE state = 'leased';
{
    CLAIM_FUNCTION.format(
        expiry="IF EXISTS (SELECT FROM tasks WHERE queue = p_queue AND state = 'leased'"
        " AND lease_expires_at < now()) THEN RAISE NOTICE 'expired'; END IF;",
        claim=CLAIM_UPDATE,
    )
}
{COMPLETE_DELETE}
CREATE FUNCTION maintain() RETURNS void LANGUAGE sql BEGIN ATOMIC SELECT 1; END;
"""

HOT = f"""
{COMMON}
CREATE TABLE tasks ({COLUMNS}, PRIMARY KEY (id, queue)) PARTITION BY HASH (queue);
{_hash_partitions("tasks", "WITH (fillfactor = 50)")}
CREATE INDEX tasks_claim_idx ON tasks (queue, priority DESC, run_at, id);
{CLAIM_FUNCTION.format(expiry="", claim=CLAIM_UPDATE)}
{COMPLETE_DELETE}
-- Expired leases: no index may hold them, so a scan of the queue's rows.
CREATE FUNCTION maintain() RETURNS void LANGUAGE sql BEGIN ATOMIC
    SELECT count(*) FROM tasks WHERE queue = 'bench:hot' AND state = 'leased' AND lease_expires_at < now();
END;
"""

LEASES = f"""
{COMMON}
CREATE TABLE tasks ({COLUMNS}, PRIMARY KEY (id, queue)) PARTITION BY HASH (queue);
{_hash_partitions("tasks")}
CREATE INDEX tasks_claim_idx ON tasks (queue, priority DESC, run_at, id);
CREATE TABLE leases (
    task_id bigint PRIMARY KEY, queue text NOT NULL, fencing_token bigint NOT NULL,
    lease_secret uuid NOT NULL, expires_at timestamptz NOT NULL, worker text
);
CREATE INDEX leases_expiry_idx ON leases (queue, expires_at);
CREATE FUNCTION claim(p_queue text, p_worker text, p_max integer)
RETURNS TABLE (id bigint, fencing_token bigint, lease_secret uuid, payload jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT FROM leases WHERE queue = p_queue AND expires_at < now()) THEN
        RAISE NOTICE 'expired';
    END IF;
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT t.id, t.payload FROM tasks t
         WHERE t.queue = p_queue AND t.state = 'pending' AND t.run_at <= now()
           AND NOT EXISTS (SELECT FROM leases l WHERE l.task_id = t.id)
         ORDER BY t.priority DESC, t.run_at, t.id
         LIMIT p_max FOR UPDATE OF t SKIP LOCKED
    ), leased AS (
        INSERT INTO leases (task_id, queue, fencing_token, lease_secret, expires_at, worker)
        SELECT p.id, p_queue, nextval('fencing_seq'), gen_random_uuid(), now() + interval '300 s', p_worker
          FROM picked p
         ORDER BY p.id
        -- The task row is not locked by a write, so a claim that read
        -- before another's lease committed picks the same task: the
        -- primary key turns that into a wait and a skip (in id order, or
        -- two such claims deadlock).
            ON CONFLICT (task_id) DO NOTHING
        RETURNING task_id, fencing_token, lease_secret
    )
    SELECT l.task_id, l.fencing_token, l.lease_secret, p.payload
      FROM leased l JOIN picked p ON p.id = l.task_id;
END $$;
CREATE FUNCTION complete_many(p_queue text, p_ids bigint[], p_tokens bigint[], p_secrets uuid[])
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = auto SET jit = off AS $$
DECLARE
    v_n integer;
BEGIN
    -- The task rows first, as the claim locks them: a claim that read before
    -- a lease was deleted waits here for nothing, instead of deadlocking
    -- on the lease row this call deletes.
    PERFORM FROM tasks t WHERE t.queue = p_queue AND t.id = ANY (p_ids) ORDER BY t.id FOR UPDATE;
    WITH input AS MATERIALIZED (
        SELECT * FROM unnest(p_ids, p_tokens, p_secrets) AS u(id, fence, secret)
    ), gone AS (
        DELETE FROM leases l USING input i
         WHERE l.task_id = i.id AND l.fencing_token = i.fence AND l.lease_secret = i.secret
        RETURNING l.*
    ), moved AS (
        DELETE FROM tasks t USING gone g
         WHERE t.queue = p_queue AND t.id = g.task_id
        RETURNING t.*, g.fencing_token AS token, g.lease_secret AS secret, g.worker AS by
    ), archived AS (
        INSERT INTO archive
        SELECT m.id, m.queue, 'done', m.priority, m.run_at, m.created_at, m.payload, m.attempts + 1,
               m.max_attempts, m.token, m.secret, NULL, now(), m.by, '{{"ok": true}}'::jsonb, now()
          FROM moved m RETURNING 1
    )
    SELECT count(*) INTO v_n FROM archived;
    RETURN v_n;
END $$;
CREATE FUNCTION maintain() RETURNS void LANGUAGE sql BEGIN ATOMIC SELECT 1; END;
"""

ROTATE = f"""
{COMMON}
CREATE TABLE generation (current integer NOT NULL);
INSERT INTO generation VALUES (0);
CREATE TABLE tasks ({COLUMNS}, gen integer NOT NULL DEFAULT 0, PRIMARY KEY (id, queue, gen))
    PARTITION BY LIST (gen);
CREATE TABLE tasks_g0 PARTITION OF tasks FOR VALUES IN (0) PARTITION BY HASH (queue);
CREATE TABLE tasks_g1 PARTITION OF tasks FOR VALUES IN (1) PARTITION BY HASH (queue);
{_hash_partitions("tasks_g0")}
{_hash_partitions("tasks_g1")}
CREATE INDEX tasks_claim_idx ON tasks (queue, priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX tasks_lease_idx ON tasks (queue, lease_expires_at) WHERE state = 'leased';
{
    CLAIM_FUNCTION.format(
        expiry="IF EXISTS (SELECT FROM tasks WHERE queue = p_queue AND state = 'leased'"
        " AND lease_expires_at < now()) THEN RAISE NOTICE 'expired'; END IF;",
        claim=CLAIM_UPDATE,
    )
}
CREATE FUNCTION complete_many(p_queue text, p_ids bigint[], p_tokens bigint[], p_secrets uuid[])
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = auto SET jit = off AS $$
DECLARE
    v_n integer;
BEGIN
    WITH input AS MATERIALIZED (
        SELECT * FROM unnest(p_ids, p_tokens, p_secrets) AS u(id, fence, secret)
    ), moved AS (
        UPDATE tasks t SET state = 'done' FROM input i
         WHERE t.queue = p_queue AND t.id = ANY (p_ids) AND t.id = i.id AND t.fencing_token = i.fence
           AND t.lease_secret = i.secret AND t.state IN ('leased', 'pending')
        RETURNING t.*
    ), archived AS (
        INSERT INTO archive
        SELECT m.id, m.queue, m.state, m.priority, m.run_at, m.created_at, m.payload, m.attempts,
               m.max_attempts, m.fencing_token, m.lease_secret, m.lease_expires_at, m.claimed_at,
               m.worker, '{{"ok": true}}'::jsonb, now()
          FROM moved m RETURNING 1
    )
    SELECT count(*) INTO v_n FROM archived;
    RETURN v_n;
END $$;
CREATE FUNCTION enqueue_gen() RETURNS integer LANGUAGE sql STABLE
BEGIN ATOMIC SELECT current FROM generation; END;
"""


def _claim_from(table: str) -> str:
    """The claim's statements on one generation's table, named outright."""
    return f"""
        IF EXISTS (SELECT FROM {table} WHERE queue = p_queue AND state = 'leased'
                    AND lease_expires_at < now()) THEN
            RAISE NOTICE 'expired';
        END IF;
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT id FROM {table}
             WHERE queue = p_queue AND state = 'pending' AND run_at <= now()
             ORDER BY priority DESC, run_at, id
             LIMIT p_max - v_got FOR UPDATE SKIP LOCKED
        )
        UPDATE {table} t SET state = 'leased', attempts = t.attempts + 1,
               fencing_token = nextval('fencing_seq'), lease_secret = gen_random_uuid(),
               lease_expires_at = now() + interval '300 s', claimed_at = now(), worker = p_worker
         WHERE t.queue = p_queue AND t.id = ANY (ARRAY(SELECT id FROM picked))
        RETURNING t.id, t.fencing_token, t.lease_secret, t.payload;
        GET DIAGNOSTICS v_n = ROW_COUNT;"""


def _complete_in(table: str) -> str:
    """complete_many's statement on one generation's table, named outright."""
    return f"""
        WITH input AS MATERIALIZED (
            SELECT * FROM unnest(p_ids, p_tokens, p_secrets) AS u(id, fence, secret)
        ), moved AS (
            UPDATE {table} t SET state = 'done' FROM input i
             WHERE t.queue = p_queue AND t.id = ANY (p_ids) AND t.id = i.id AND t.fencing_token = i.fence
               AND t.lease_secret = i.secret AND t.state IN ('leased', 'pending')
            RETURNING t.*
        ), archived AS (
            INSERT INTO archive
            SELECT m.id, m.queue, m.state, m.priority, m.run_at, m.created_at, m.payload, m.attempts,
                   m.max_attempts, m.fencing_token, m.lease_secret, m.lease_expires_at, m.claimed_at,
                   m.worker, '{{"ok": true}}'::jsonb, now()
              FROM moved m RETURNING 1
        )
        SELECT count(*) INTO v_n FROM archived;"""


# rotate, with every statement naming its generation's table: a plan then
# locks only that generation, and a generation that is retired (no live
# row, no statement reading it) can be locked and emptied at once.
ROTATE_NAMED = f"""
{COMMON}
CREATE TABLE generations (gen integer PRIMARY KEY, phase text NOT NULL);
INSERT INTO generations VALUES (0, 'current'), (1, 'retired');
CREATE TABLE tasks ({COLUMNS}, gen integer NOT NULL, PRIMARY KEY (id, queue, gen))
    PARTITION BY LIST (gen);
CREATE TABLE tasks_g0 PARTITION OF tasks FOR VALUES IN (0) PARTITION BY HASH (queue);
CREATE TABLE tasks_g1 PARTITION OF tasks FOR VALUES IN (1) PARTITION BY HASH (queue);
{_hash_partitions("tasks_g0")}
{_hash_partitions("tasks_g1")}
CREATE INDEX tasks_claim_idx ON tasks (queue, priority DESC, run_at, id) WHERE state = 'pending';
CREATE INDEX tasks_lease_idx ON tasks (queue, lease_expires_at) WHERE state = 'leased';
CREATE FUNCTION enqueue_gen() RETURNS integer LANGUAGE sql STABLE
BEGIN ATOMIC SELECT gen FROM generations WHERE phase = 'current'; END;
-- The draining generation first: its tasks are the older ones.
CREATE FUNCTION claim(p_queue text, p_worker text, p_max integer)
RETURNS TABLE (id bigint, fencing_token bigint, lease_secret uuid, payload jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_gen integer;
    v_got integer := 0;
    v_n   integer;
BEGIN
    FOR v_gen IN SELECT gen FROM generations WHERE phase <> 'retired' ORDER BY phase = 'current' LOOP
        EXIT WHEN v_got >= p_max;
        IF v_gen = 0 THEN {_claim_from("tasks_g0")}
        ELSE {_claim_from("tasks_g1")}
        END IF;
        v_got := v_got + v_n;
    END LOOP;
END $$;
CREATE FUNCTION complete_many(p_queue text, p_ids bigint[], p_tokens bigint[], p_secrets uuid[])
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = auto SET jit = off AS $$
DECLARE
    v_gen   integer;
    v_n     integer;
    v_total integer := 0;
BEGIN
    FOR v_gen IN SELECT gen FROM generations WHERE phase <> 'retired' LOOP
        IF v_gen = 0 THEN {_complete_in("tasks_g0")}
        ELSE {_complete_in("tasks_g1")}
        END IF;
        v_total := v_total + v_n;
    END LOOP;
    RETURN v_total;
END $$;
"""

# The floor: PgQ's consumer model without per-task leases. Events are only
# appended; consumers take the next ids after a cursor row (one update per
# batch) and copy what they finished to the archive. No fencing, no retries,
# no priorities: what a queue costs with no per-task state at all. (Safe
# here with one producer only: ids commit in order.)
APPEND = f"""
{COMMON}
CREATE TABLE tasks ({COLUMNS});
CREATE INDEX tasks_id_idx ON tasks (queue, id);
CREATE TABLE cursors (queue text PRIMARY KEY, pos bigint NOT NULL);
INSERT INTO cursors VALUES ('bench:hot', 0);
CREATE FUNCTION claim(p_queue text, p_worker text, p_max integer)
RETURNS TABLE (id bigint, fencing_token bigint, lease_secret uuid, payload jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_from bigint;
    v_to   bigint;
BEGIN
    SELECT pos INTO v_from FROM cursors WHERE queue = p_queue FOR UPDATE;
    SELECT max(e.id) INTO v_to
      FROM (SELECT t.id FROM tasks t WHERE t.queue = p_queue AND t.id > v_from ORDER BY t.id LIMIT p_max) e;
    IF v_to IS NULL THEN
        RETURN;
    END IF;
    UPDATE cursors SET pos = v_to WHERE queue = p_queue;
    RETURN QUERY SELECT t.id, t.id, '00000000-0000-0000-0000-000000000000'::uuid, t.payload
                   FROM tasks t WHERE t.queue = p_queue AND t.id > v_from AND t.id <= v_to;
END $$;
CREATE FUNCTION complete_many(p_queue text, p_ids bigint[], p_tokens bigint[], p_secrets uuid[])
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = auto SET jit = off AS $$
DECLARE
    v_n integer;
BEGIN
    WITH archived AS (
        INSERT INTO archive
        SELECT t.*, '{{"ok": true}}'::jsonb, now() FROM tasks t
         WHERE t.queue = p_queue AND t.id = ANY (p_ids)
        RETURNING 1
    )
    SELECT count(*) INTO v_n FROM archived;
    RETURN v_n;
END $$;
CREATE FUNCTION maintain() RETURNS void LANGUAGE sql BEGIN ATOMIC SELECT 1; END;
"""

DESIGNS = {
    "today": TODAY,
    "hot": HOT,
    "leases": LEASES,
    "rotate": ROTATE,
    "rotate_named": ROTATE_NAMED,
    "append": APPEND,
}
HOT_RELATIONS = {
    "today": "relname ~ '^tasks_p'",
    "hot": "relname ~ '^tasks_p'",
    "leases": "(relname ~ '^tasks_p' OR relname = 'leases')",
    "rotate": "relname ~ '^tasks_g[01]_p'",
    "rotate_named": "relname ~ '^tasks_g[01]_p'",
    "append": "relname IN ('tasks', 'cursors')",
}


# --------------------------------------------------------------------------
# Load


def produce(dsn: str, design: str, counts: dict[str, int], stop: threading.Event) -> None:
    gen = ", gen" if design.startswith("rotate") else ""
    gen_value = ", enqueue_gen()" if design.startswith("rotate") else ""
    insert = f"INSERT INTO tasks (queue, payload{gen}) SELECT %s, p{gen_value} FROM unnest(%s::jsonb[]) AS p"
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            if counts["enqueued"] - counts["done"] >= PENDING:
                time.sleep(0.002)
                continue
            start = counts["enqueued"]
            conn.execute(insert, (QUEUE, [Jsonb({"n": i}) for i in range(start, start + BATCH)]))
            counts["enqueued"] += BATCH


def consume(dsn: str, name: str, counts: dict[str, int], lock: threading.Lock, stop: threading.Event) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute("SELECT * FROM claim(%s, %s, %s)", (QUEUE, name, CLAIM)).fetchall()
            if not rows:
                time.sleep(0.001)
                continue
            ids, tokens, secrets = ([row[i] for row in rows] for i in range(3))
            n = conn.execute("SELECT complete_many(%s, %s, %s, %s)", (QUEUE, ids, tokens, secrets)).fetchone()
            assert n is not None and n[0] == len(rows), (n, len(rows))
            with lock:
                counts["done"] += len(rows)


def maintain(dsn: str, design: str, counts: dict[str, int], stop: threading.Event) -> None:
    """Once a second what the design needs besides autovacuum; for rotate,
    every ROTATE_S seconds a switch of generation and a TRUNCATE of the old
    one once it holds no live row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        last_rotation = time.monotonic()
        while not stop.wait(1.0):
            if design == "rotate_named":
                if retire_named(conn):
                    counts["truncates"] += 1
                elif time.monotonic() - last_rotation >= ROTATE_S and swap_named(conn):
                    last_rotation = time.monotonic()
                continue
            if design != "rotate":
                conn.execute("SELECT maintain()")
                continue
            if time.monotonic() - last_rotation < ROTATE_S:
                continue
            last_rotation = time.monotonic()
            row = conn.execute("SELECT current FROM generation").fetchone()
            assert row is not None
            old = int(row[0])
            conn.execute("UPDATE generation SET current = 1 - current")
            deadline = time.monotonic() + ROTATE_S
            while time.monotonic() < deadline and not stop.is_set():
                if truncate_if_drained(conn, f"tasks_g{old}"):
                    counts["truncates"] += 1
                    break
                time.sleep(0.05)


def swap_named(conn: psycopg.Connection[Any]) -> bool:
    """New tasks go to the retired (empty) generation; the current one
    drains. Only once the last draining generation was retired."""
    with conn.transaction():
        row = conn.execute("SELECT count(*) FROM generations WHERE phase = 'draining'").fetchone()
        if row is None or row[0]:
            return False
        conn.execute(
            "UPDATE generations SET phase = CASE phase WHEN 'current' THEN 'draining' ELSE 'current' END"
        )
    return True


def retire_named(conn: psycopg.Connection[Any]) -> bool:
    """Retire and empty the draining generation once it holds no live row."""
    row = conn.execute("SELECT gen FROM generations WHERE phase = 'draining'").fetchone()
    if row is None:
        return False
    gen = int(row[0])
    return truncate_if_drained(
        conn, f"tasks_g{gen}", f"UPDATE generations SET phase = 'retired' WHERE gen = {gen}"
    )


def hot_stats(conn: psycopg.Connection[Any], design: str) -> dict[str, int]:
    row = conn.execute(
        "SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0), coalesce(sum(n_tup_del), 0),"
        "       coalesce(sum(n_dead_tup), 0), coalesce(sum(autovacuum_count), 0),"
        "       pg_current_wal_lsn() - '0/0'::pg_lsn"
        f"  FROM pg_stat_user_tables WHERE schemaname = 'public' AND {HOT_RELATIONS[design]}"
    ).fetchone()
    assert row is not None
    keys = ("updated", "hot_updated", "deleted", "dead", "autovacuums", "wal")
    return dict(zip(keys, (int(v) for v in row), strict=True))


def run_design(admin_dsn: str, postmaster: int, design: str, seconds: float) -> dict[str, Any]:
    dbname = f"hot_{design}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {dbname}")
    dsn = with_db(admin_dsn, dbname)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DESIGNS[design])
    counts = {"enqueued": 0, "done": 0, "truncates": 0}
    lock, stop = threading.Lock(), threading.Event()
    failures: list[BaseException] = []

    def guarded(target: Callable[..., None], *args: Any) -> threading.Thread:
        """A thread whose error ends the run and fails the script: a design
        that lost a consumer would be measured at half its load."""

        def run() -> None:
            try:
                target(*args)
            except BaseException as error:
                failures.append(error)
                stop.set()
                raise

        return threading.Thread(target=run)

    threads = [
        guarded(produce, dsn, design, counts, stop),
        guarded(maintain, dsn, design, counts, stop),
        *(guarded(consume, dsn, f"c{i}", counts, lock, stop) for i in range(CONSUMERS)),
    ]
    for thread in threads:
        thread.start()
    dead_peak = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while counts["done"] < PENDING and time.monotonic() < deadline and not failures:
            time.sleep(0.05)
        before = hot_stats(conn, design)
        cpu0, done0, t0 = cluster_cpu_s(postmaster), counts["done"], time.monotonic()
        halves: list[float] = []
        mark_done, mark_t = done0, t0
        while (now := time.monotonic()) < t0 + seconds and not failures:
            time.sleep(min(1.0, t0 + seconds - now))
            dead_peak = max(dead_peak, hot_stats(conn, design)["dead"])
            if not halves and time.monotonic() >= t0 + seconds / 2:
                halves.append((counts["done"] - mark_done) / (time.monotonic() - mark_t))
                mark_done, mark_t = counts["done"], time.monotonic()
        cpu1, done1, t1 = cluster_cpu_s(postmaster), counts["done"], time.monotonic()
        halves.append((done1 - mark_done) / (t1 - mark_t))
        stop.set()
        for thread in threads:
            thread.join(30)
        time.sleep(1.0)  # the closed sessions' statistics reach the views
        after = hot_stats(conn, design)
    if failures:
        raise RuntimeError(f"{design}: a load thread failed") from failures[0]
    tasks = done1 - done0
    diff = {k: after[k] - before[k] for k in after}
    return {
        "design": design,
        "seconds": round(t1 - t0, 1),
        "tasks": tasks,
        "tasks_per_s": round(tasks / (t1 - t0), 1),
        "second_half_vs_first": round(halves[1] / halves[0], 3) if halves[0] else None,
        "db_cpu_us_per_task": round((cpu1 - cpu0) / tasks * 1e6, 1),
        "dead_per_task": round((diff["updated"] - diff["hot_updated"] + diff["deleted"]) / tasks, 3),
        "dead_peak": dead_peak,
        "wal_bytes_per_task": round(diff["wal"] / tasks),
        "autovacuums": diff["autovacuums"],
        "truncates": counts["truncates"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--designs", default=",".join(DESIGNS), help="designs (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=90.0, help="per design and round")
    parser.add_argument("--rounds", type=int, default=1, help="the designs in alternation, this many times")
    parser.add_argument("--out", type=Path, default=BENCH / "results", help="results directory")
    args = parser.parse_args()
    designs = [d for d in args.designs.split(",") if d]
    unknown = sorted(set(designs) - set(DESIGNS))
    if unknown:
        parser.error(f"unknown design(s) {', '.join(unknown)}; choose from {', '.join(DESIGNS)}")
    results: list[dict[str, Any]] = []
    with private_cluster() as (admin_dsn, postmaster):
        for round_ in range(args.rounds):
            baseline = None
            for design in designs:
                result = run_design(admin_dsn, postmaster, design, args.seconds)
                result["round"] = round_ + 1
                if design == "today":
                    baseline = result["tasks_per_s"]
                result["vs_today"] = round(result["tasks_per_s"] / baseline, 3) if baseline else None
                print(json.dumps(result), flush=True)
                results.append(result)
    report = {
        "benchmark": "hot_table",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"hot-table-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
