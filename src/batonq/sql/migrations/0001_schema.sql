-- batonq 0001: the schema of release 0.1.0 (tables, indexes, types, roles,
-- grants). The functions are in ../engine. Never edit this file: a change to
-- the schema is a new migration.
--
-- Hot and cold: claimable and leased tasks live in batonq.tasks, hash
-- partitioned by queue, so a claim only ever reads one small partition.
-- Finished tasks move to batonq.archive, range partitioned by finish day, so
-- retention drops whole partitions instead of deleting rows.

CREATE SCHEMA IF NOT EXISTS batonq;

-- Each migration file records itself here as its last statement, so a
-- schema applied with psql -f looks the same as one applied by batonq migrate.
CREATE TABLE batonq.migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION batonq._valid_queue_name(p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_name ~ '^[a-z0-9][a-z0-9_.:-]{0,127}$';

CREATE TABLE batonq.queues (
    name              text PRIMARY KEY,
    lease_s           integer NOT NULL DEFAULT 300 CHECK (lease_s BETWEEN 1 AND 3600),
    max_attempts      integer NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 1000),
    backoff_base_s    double precision NOT NULL DEFAULT 2 CHECK (backoff_base_s >= 0),
    backoff_max_s     double precision NOT NULL DEFAULT 3600 CHECK (backoff_max_s >= 0),
    retention_s       integer NOT NULL DEFAULT 604800 CHECK (retention_s >= 0),
    max_body_bytes    integer NOT NULL DEFAULT 131072 CHECK (max_body_bytes BETWEEN 1 AND 104857600),
    paused            boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queue_name_format CHECK (batonq._valid_queue_name(name))
);

CREATE SEQUENCE batonq.task_id_seq;

-- One sequence for every fencing token: each claim draws anew, so a token is
-- greater than every token drawn before it, on every task.
CREATE SEQUENCE batonq.fencing_seq;

CREATE TABLE batonq.tasks (
    id               bigint NOT NULL,
    queue            text NOT NULL,
    state            text NOT NULL CHECK (state IN ('waiting', 'held', 'pending', 'leased')),
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL,
    idempotency_key  text,
    parent_id        bigint,
    root_id          bigint NOT NULL,
    fencing_token    bigint,
    -- The secret half of the lease token. Only the claimer ever sees it;
    -- no listing returns it. NULL once the holder gave the lease back.
    lease_secret     uuid,
    lease_s          integer,
    lease_expires_at timestamptz,
    claimed_at       timestamptz,
    worker           text,
    -- The API key whose request claimed the lease (NULL for a claim made
    -- without one): a write that names the lease by task and fencing token,
    -- not by its lease token, is taken from that key only.
    claim_key        bigint,
    stage            text,
    last_error       text,
    errors           jsonb NOT NULL DEFAULT '[]',
    -- A fan-out element collected by a join: the join's task, and this
    -- element's place in the list of results.
    join_task_id     bigint,
    fan_index        integer,
    PRIMARY KEY (id, queue)
) PARTITION BY HASH (queue);

DO $$
BEGIN
    FOR i IN 0..15 LOOP
        EXECUTE format(
            'CREATE TABLE batonq.tasks_p%s PARTITION OF batonq.tasks
                 FOR VALUES WITH (MODULUS 16, REMAINDER %s)', lpad(i::text, 2, '0'), i);
    END LOOP;
END $$;

-- The claim reads this index from its left edge: claimable tasks of one queue
-- in claim order. Partial, so it holds only pending tasks and stays small
-- however many tasks are leased, held or waiting.
CREATE INDEX tasks_claim_idx ON batonq.tasks (queue, priority DESC, run_at, id)
    WHERE state = 'pending';

-- Expired leases of one queue, oldest first (claim and sweeper).
CREATE INDEX tasks_lease_idx ON batonq.tasks (queue, lease_expires_at)
    WHERE state = 'leased';

-- No index by state: it would cost every claim and insert a write, and
-- mislead the planner away from the primary key; listings by state read the
-- one partition's primary key backwards instead.
-- Held and waiting tasks of a queue, for operator listings; claims never
-- touch these rows, so the index costs the hot path nothing.
CREATE INDEX tasks_parked_idx ON batonq.tasks (queue, id DESC) WHERE state IN ('held', 'waiting');

-- The tasks of a run. A task without a parent is found by its id, so only
-- children are indexed: plain tasks pay no write here.
CREATE INDEX tasks_root_idx ON batonq.tasks (root_id) WHERE parent_id IS NOT NULL;

CREATE TABLE batonq.archive (
    id               bigint NOT NULL,
    queue            text NOT NULL,
    state            text NOT NULL CHECK (state IN ('done', 'dead', 'cancelled')),
    priority         integer NOT NULL,
    run_at           timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    payload          jsonb NOT NULL,
    attempts         integer NOT NULL,
    max_attempts     integer NOT NULL,
    idempotency_key  text,
    parent_id        bigint,
    root_id          bigint NOT NULL,
    fencing_token    bigint,
    claimed_at       timestamptz,
    worker           text,
    stage            text,
    last_error       text,
    errors           jsonb NOT NULL,
    join_task_id     bigint,
    fan_index        integer,
    result           jsonb,
    finished_at      timestamptz NOT NULL,
    -- The secret of the lease the task finished under: a repeated complete
    -- is a replay only from that lease. No listing returns it.
    lease_secret     uuid,
    -- The API key that claimed that lease: its replays may name the lease by
    -- task and fencing token (batonq.lease_token_for_key).
    claim_key        bigint
) PARTITION BY RANGE (finished_at);

-- Rows land here only when the day's partition was never made (maintenance
-- did not run for days); nothing is lost, retention deletes them row by row.
CREATE TABLE batonq.archive_default PARTITION OF batonq.archive DEFAULT;

CREATE INDEX archive_id_idx ON batonq.archive (id);

-- Listings and counts by queue and state, newest first.
CREATE INDEX archive_queue_idx ON batonq.archive (queue, state, id DESC);

CREATE INDEX archive_root_idx ON batonq.archive (root_id) WHERE parent_id IS NOT NULL;

CREATE INDEX archive_join_idx ON batonq.archive (join_task_id, fan_index) WHERE join_task_id IS NOT NULL;

-- Dead tasks across queues, newest first. Partial: only dead rows pay for
-- it, and the dead-letter page reads it from its left edge.
CREATE INDEX archive_dead_idx ON batonq.archive (id DESC) WHERE state = 'dead';

-- Finished tasks per queue and state, kept as tasks enter and leave the
-- archive (triggers on batonq.archive, engine/operator.sql), so queue_stats
-- costs the same with ten million finished tasks as with none. Rows are deltas, never
-- updated in place: concurrent completes each add a row and do not wait on
-- one another; maintain() folds them into one row per (queue, state).
CREATE TABLE batonq.finished_counts (
    queue  text NOT NULL,
    state  text NOT NULL,
    n      bigint NOT NULL
);

CREATE INDEX finished_counts_queue_idx ON batonq.finished_counts (queue);

-- Until when someone waits for wake-ups on a queue (batonq.await_work and
-- batonq._wake). Unlogged: after a crash it starts empty, and waiters
-- register again before their next sleep.
CREATE UNLOGGED TABLE batonq.awaited (
    queue text PRIMARY KEY,
    until timestamptz NOT NULL
);

-- Idempotent enqueue: the first task to take (queue, key) keeps it for as
-- long as that task is retained.
CREATE TABLE batonq.idempotency_keys (
    queue       text NOT NULL,
    key         text NOT NULL,
    task_id     bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);

-- The writes about a leased task that a replay or an audit needs: accepted
-- fails (a replay returns the first outcome per task and fencing token),
-- replays, and refused writes, set aside for audit. An accepted complete
-- writes no row here: the task's archive row holds its token and result.
CREATE TABLE batonq.submits (
    task_id        bigint NOT NULL,
    queue          text NOT NULL,
    fencing_token  bigint NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('complete', 'fail', 'heartbeat', 'release')),
    outcome        text NOT NULL CHECK (outcome IN ('accepted', 'replayed', 'set_aside')),
    state_after    text NOT NULL,
    body           jsonb,
    at             timestamptz NOT NULL DEFAULT now(),
    -- An accepted fail's lease secret: a repeated fail is a replay only
    -- from that lease.
    lease_secret   uuid
) PARTITION BY RANGE (at);

CREATE TABLE batonq.submits_default PARTITION OF batonq.submits DEFAULT;

CREATE INDEX submits_task_idx ON batonq.submits (task_id, fencing_token);

-- The queue graph (engine/graph.sql): edges between queues, the joins that
-- wait on a fan-out, and the batons handed along edges.

CREATE TABLE batonq.edges (
    id            bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    from_queue    text NOT NULL REFERENCES batonq.queues (name),
    to_queue      text NOT NULL REFERENCES batonq.queues (name),
    -- JSON pointer into the result: the next payload (NULL: the whole result).
    map           text,
    -- JSON pointer to an array in the result: one downstream task per element
    -- (map then applies to each element).
    fan_out       text,
    -- Route only results where the value at when_pointer equals when_equals,
    -- or is present (when_present true) or absent (false).
    when_pointer  text,
    when_equals   jsonb,
    when_present  boolean,
    -- A join: to_queue gets one task per fan-out into from_queue, waiting
    -- until every element is finished, then with the ordered results.
    is_join       boolean NOT NULL DEFAULT false,
    -- For a join: a dead element yields null in the list instead of a dead join.
    partial       boolean NOT NULL DEFAULT false,
    -- NULL: inherit the priority of the task the baton comes from.
    priority      integer,
    delay_s       double precision NOT NULL DEFAULT 0 CHECK (delay_s >= 0),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (from_queue, to_queue)
);

-- One row per join task: how many fan-out elements it waits on.
CREATE TABLE batonq.joins (
    join_task_id  bigint PRIMARY KEY,
    join_queue    text NOT NULL,
    expected      integer NOT NULL,
    finished      integer NOT NULL DEFAULT 0,
    partial       boolean NOT NULL,
    resolved      boolean NOT NULL DEFAULT false
);

-- Each baton's identity: one task per (task it came from, edge, index). A
-- table of its own, not an idempotency key: no enqueue, whatever key it
-- brings, can take a baton's place or stop it from being made.
CREATE TABLE batonq.batons (
    parent_id   bigint NOT NULL,
    edge_id     bigint NOT NULL,
    fan_index   integer NOT NULL,
    task_id     bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (parent_id, edge_id, fan_index)
);

-- API keys for the HTTP service and the MCP server (engine/keys.sql).

CREATE TABLE batonq.api_keys (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name          text NOT NULL DEFAULT '',
    ring          smallint NOT NULL CHECK (ring BETWEEN 0 AND 3),
    queues        text[] NOT NULL DEFAULT '{*}' CHECK (cardinality(queues) > 0),
    secret_hash   bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

-- The rows the engine's functions return. A function's return type is part
-- of its signature: changing one of these needs a migration that drops the
-- functions returning it.

-- A lease token is queue/task_id/fencing_token/secret: it names its task (so
-- writes need nothing else), routes by queue, and carries the fencing token.
CREATE TYPE batonq.lease_ref AS (queue text, task_id bigint, fencing_token bigint, secret uuid);

-- A task as every reader sees it, hot or archived; it never holds the lease
-- secret.
CREATE TYPE batonq.task_view AS (
    id bigint, queue text, state text, priority integer, run_at timestamptz,
    created_at timestamptz, payload jsonb, attempts integer, max_attempts integer,
    idempotency_key text, parent_id bigint, root_id bigint, fencing_token bigint,
    lease_expires_at timestamptz, claimed_at timestamptz, worker text, stage text,
    last_error text, errors jsonb, result jsonb, finished_at timestamptz
);

-- The reply to every write about a leased task.
CREATE TYPE batonq.submit_reply AS (
    task_id bigint, queue text, outcome text, state text,
    fencing_token bigint, current_fencing_token bigint,
    lease_expires_at timestamptz, lease_expires_in_s double precision
);

CREATE TYPE batonq.enqueued AS (
    task_id bigint, queue text, created boolean, state text, run_at timestamptz
);

CREATE TYPE batonq.lease AS (
    task_id bigint, queue text, fencing_token bigint, lease_token text,
    lease_expires_at timestamptz, lease_expires_in_s double precision,
    attempt integer, max_attempts integer, priority integer, "row" jsonb,
    idempotency_key text, parent_id bigint, root_id bigint, created_at timestamptz,
    run_at timestamptz
);

-- A write refused and set aside in the submit ledger (a late complete, fail,
-- heartbeat or release): its kind, the fencing token it presented, when, the
-- task's state then, and who held the lease that token names: its worker and
-- the API key that claimed it (NULL when not known, e.g. a released lease).
CREATE TYPE batonq.set_aside_write AS (
    task_id bigint, kind text, fencing_token bigint, at timestamptz, state text,
    worker text, key_id bigint
);

CREATE TYPE batonq.edge AS (
    from_queue text, to_queue text, map text, fan_out text, when_pointer text,
    when_equals jsonb, when_present boolean, is_join boolean, partial boolean,
    priority integer, delay_s double precision
);

CREATE TYPE batonq.run_status AS (
    root_id bigint, status text, tasks bigint, unfinished bigint, done bigint, dead bigint,
    cancelled bigint, failed_task_id bigint, failed_queue text, error text
);

CREATE TYPE batonq.api_key AS (
    id bigint, name text, ring smallint, queues text[], created_at timestamptz,
    last_used_at timestamptz, revoked_at timestamptz
);

-- Nothing but the engine's functions may touch the tables.
REVOKE ALL ON ALL TABLES IN SCHEMA batonq FROM PUBLIC;

REVOKE ALL ON ALL SEQUENCES IN SCHEMA batonq FROM PUBLIC;

-- Roles are cluster-wide: made once, by whoever may (a superuser, or a DBA
-- beforehand). Looked up first, so that a database owner without CREATEROLE
-- can migrate where they exist; the exception covers a concurrent creator.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'batonq_reader') THEN
        CREATE ROLE batonq_reader NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'batonq_worker') THEN
        CREATE ROLE batonq_worker NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

DO $$
BEGIN
    IF NOT pg_has_role('batonq_worker', 'batonq_reader', 'MEMBER') THEN
        GRANT batonq_reader TO batonq_worker;
    END IF;
END $$;

GRANT USAGE ON SCHEMA batonq TO batonq_reader, batonq_worker;

INSERT INTO batonq.migrations (version, name) VALUES (1, 'schema');
