-- batonq 0001: the schema.
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

-- Finished tasks per queue and state, kept as tasks enter and leave the
-- archive (triggers on batonq.archive, 0006), so queue_stats costs the same
-- with ten million finished tasks as with none. Rows are deltas, never
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
