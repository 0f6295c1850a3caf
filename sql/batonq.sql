-- batonq schema: every migration, then the engine, all or nothing.
BEGIN;

-- migrations/0001_schema.sql
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

-- Which engine (sql/engine) the database has: a hash of its files, written by
-- every migrate in the same transaction, so that batonq migrate --check sees
-- functions older than the installed batonq's. One row.
CREATE TABLE batonq.engine (
    sha256      text NOT NULL,
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

-- migrations/0002_flow.sql
-- batonq 0002: flow control -- the tables of cron schedules and their
-- firings, of debounce windows, and the audit of settings changes. Their
-- functions are in engine/audit.sql, engine/schedules.sql and
-- engine/debounce.sql.

-- Every change to a queue's settings or a schedule: who, when, and the
-- row before and after (NULL before: created; NULL after: removed).
CREATE TABLE batonq.settings_audit (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text NOT NULL,
    kind    text NOT NULL CHECK (kind IN ('queue', 'schedule')),
    name    text NOT NULL,
    before  jsonb,
    after   jsonb
);
CREATE INDEX settings_audit_name_idx ON batonq.settings_audit (kind, name, id DESC);

CREATE TABLE batonq.schedules (
    name          text PRIMARY KEY,
    cron          text NOT NULL CHECK (length(cron) BETWEEN 1 AND 200),
    tz            text NOT NULL,
    queue         text NOT NULL,
    payload       jsonb NOT NULL,
    -- Ticks that passed while no firer ran: one task for all of them
    -- ('fire-once'), or none ('skip').
    missed        text NOT NULL CHECK (missed IN ('fire-once', 'skip')),
    paused        boolean NOT NULL DEFAULT false,
    -- Ticks after this moment are the schedule's: set at creation, at
    -- every change and at resume, so ticks from before are never fired.
    armed_at      timestamptz NOT NULL DEFAULT now(),
    -- The first tick not fired yet; NULL until the firer has computed the
    -- first tick after armed_at.
    next_tick     timestamptz,
    last_tick     timestamptz,
    last_task_id  bigint,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedule_name_format CHECK (batonq._valid_queue_name(name))
);
CREATE INDEX schedules_due_idx ON batonq.schedules (next_tick NULLS FIRST) WHERE NOT paused;

-- The task each fired tick enqueued: the key (schedule, tick) is the
-- firing's idempotency key, kept apart from batonq.idempotency_keys so no
-- key a client chooses can ever collide with it.
CREATE TABLE batonq.schedule_firings (
    schedule  text NOT NULL REFERENCES batonq.schedules ON DELETE CASCADE,
    tick      timestamptz NOT NULL,
    task_id   bigint NOT NULL,
    -- Fired late, standing for the ticks missed while no firer ran.
    catch_up  boolean NOT NULL,
    fired_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, tick)
);

CREATE TYPE batonq.due_schedule AS (
    name text, cron text, tz text, armed_at timestamptz, next_tick timestamptz, now timestamptz
);

-- The open window of each debounce key: the task that collects the
-- window's enqueues, and when the window opened (max_wait_s counts from
-- there). Its own key space: a debounce key never meets an idempotency key.
CREATE TABLE batonq.debounces (
    queue     text NOT NULL,
    key       text NOT NULL,
    task_id   bigint NOT NULL,
    opened_at timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
);

-- New tables grant nothing to PUBLIC: only the engine's functions touch them.

INSERT INTO batonq.migrations (version, name) VALUES (2, 'flow');

-- migrations/0003_limits.sql
-- batonq 0003: concurrency and rate limits. A queue may cap the tasks leased
-- at once (max_leased), those leased per group (group_max_leased: tasks carry
-- an optional group, e.g. a customer id), its claims per period (rate_limit
-- per rate_period_s, a token bucket) and each group's claims per period
-- (group_rate_limit per rate_period_s, a bucket per group). The claim
-- enforces them (engine/claim.sql).

-- SQL-bodied functions that take or return the rows changed below depend
-- on their row types, which then cannot change: dropped here, made again by
-- the engine files. (IF EXISTS: a fresh database has no functions yet.)
DROP FUNCTION IF EXISTS batonq.run_tasks(bigint);
DROP FUNCTION IF EXISTS batonq.dead_tasks(text[], text, text, integer, bigint);
DROP FUNCTION IF EXISTS batonq._backoff_s(batonq.queues, integer);
DROP FUNCTION IF EXISTS batonq._archive_row(batonq.tasks, text, jsonb, text, jsonb);
DROP FUNCTION IF EXISTS batonq._hot_view(batonq.tasks);
DROP FUNCTION IF EXISTS batonq._archive_view(batonq.archive);

ALTER TABLE batonq.queues
    ADD COLUMN max_leased integer CHECK (max_leased >= 1),
    ADD COLUMN group_max_leased integer CHECK (group_max_leased >= 1),
    ADD COLUMN rate_limit integer CHECK (rate_limit >= 1),
    ADD COLUMN group_rate_limit integer CHECK (group_rate_limit >= 1),
    ADD COLUMN rate_period_s double precision NOT NULL DEFAULT 1
        CHECK (rate_period_s > 0 AND rate_period_s <= 86400);

-- The group a task counts against (shown to users as "group"). Its length
-- is checked by the enqueues (batonq._check_group).
ALTER TABLE batonq.tasks ADD COLUMN group_key text;
ALTER TABLE batonq.archive ADD COLUMN group_key text;

-- The leased tasks of a queue per group: a group-limited claim counts them.
-- Partial on leased rows, so it stays as small as the leases held.
CREATE INDEX tasks_leased_group_idx ON batonq.tasks (queue, group_key)
    WHERE state = 'leased' AND group_key IS NOT NULL;

-- Each rate-limited queue's token bucket: the tokens it held at "at". A
-- table apart from batonq.queues, so a claim's refill is neither a settings
-- change (audited) nor a lock on the queue's settings row. Made full by the
-- first claim after the rate was set.
CREATE TABLE batonq.rate_buckets (
    queue   text PRIMARY KEY,
    tokens  double precision NOT NULL,
    at      timestamptz NOT NULL
);

-- Each group's token bucket in a queue with group_rate_limit, kept as one
-- time: "full_at", when the bucket is full again (each token taken moves it
-- rate_period_s / group_rate_limit later; engine/claim.sql). A table apart
-- from rate_buckets, not a wider one: the queue's bucket is one row read by
-- its key on every claim, and a group column in its key would need a
-- stand-in for "the whole queue". A missing row is a full bucket: a claim
-- makes the rows of the groups it takes from, and the maintenance removes
-- the full ones (full_at passed), so the table holds the groups claimed from
-- lately, not every group ever seen.
CREATE TABLE batonq.group_rate_buckets (
    queue      text NOT NULL,
    group_key  text NOT NULL,
    full_at    timestamptz NOT NULL,
    PRIMARY KEY (queue, group_key)
);

-- The empty buckets of a queue are those full latest (full_at beyond
-- now + (group_rate_limit - 1) tokens' time): a claim skips their groups
-- and rate_wait_s reads their soonest token, without reading the others.
CREATE INDEX group_rate_buckets_full_at_idx ON batonq.group_rate_buckets (queue, full_at);

ALTER TYPE batonq.task_view ADD ATTRIBUTE "group" text;
ALTER TYPE batonq.lease ADD ATTRIBUTE "group" text;

-- Signatures that changed: the enqueues take a group, configure_queue the
-- limits and the auditing actor (configure_queue_as is folded into it).
DROP FUNCTION IF EXISTS batonq.enqueue(text, jsonb, integer, double precision, integer, text, boolean, bigint);
DROP FUNCTION IF EXISTS batonq.enqueue_many(text, jsonb[], text[], integer[], double precision[], integer, boolean, bigint);
DROP FUNCTION IF EXISTS batonq.enqueue_debounced(text, text, jsonb, double precision, double precision, text, integer, integer);
DROP FUNCTION IF EXISTS batonq.configure_queue_as(text, text, integer, integer, double precision, double precision, integer, integer, boolean);
-- _result_limit became _submit_settings (the limit and whether the queue's
-- concurrency is limited, in one look).
DROP FUNCTION IF EXISTS batonq._result_limit(text);
DROP FUNCTION IF EXISTS batonq.configure_queue(text, integer, integer, double precision, double precision, integer, integer, boolean);

-- New tables grant nothing to PUBLIC: only the engine's functions touch them.

INSERT INTO batonq.migrations (version, name) VALUES (3, 'limits');

-- migrations/0004_shape.sql
-- The settings and the schedules of a page of queues are read for the
-- page's queues alone: list_queues and list_schedules take the queue names
-- (engine/operator.sql, engine/schedules.sql make the new ones).
DROP FUNCTION IF EXISTS batonq.list_queues();
DROP FUNCTION IF EXISTS batonq.list_schedules();

-- A page's schedules, found by their queues.
CREATE INDEX schedules_queue_idx ON batonq.schedules (queue);

INSERT INTO batonq.migrations (version, name) VALUES (4, 'shape');

-- migrations/0005_joins.sql
-- batonq 0005: a join is resolved when it gathers, and only then
-- (engine/graph.sql): a join that died of an element, or was cancelled,
-- before gathering may come back when that element (or the join) is retried,
-- and keeps counting its elements meanwhile. Earlier, such a join was marked
-- resolved at once, and the elements that finished after it were not
-- counted. Those joins are unresolved here, with their count made again from
-- their finished elements -- where every element is still there to count; a
-- join whose elements retention already removed stays as it was. A join that
-- never gathered still holds the empty list it was made with.
WITH hot AS MATERIALIZED (
    SELECT t.join_task_id, count(*) AS n FROM batonq.tasks t
     WHERE t.join_task_id IS NOT NULL GROUP BY t.join_task_id
), stopped AS (
    SELECT j.join_task_id, j.expected,
           (SELECT count(*) FROM batonq.archive a WHERE a.join_task_id = j.join_task_id) AS finished
      FROM batonq.joins j
     WHERE j.resolved AND j.expected > 0
       AND EXISTS (SELECT FROM batonq.archive a
                    WHERE a.id = j.join_task_id AND a.state IN ('dead', 'cancelled')
                      AND a.payload = '[]'::jsonb)
)
UPDATE batonq.joins j SET resolved = false, finished = s.finished
  FROM stopped s LEFT JOIN hot h ON h.join_task_id = s.join_task_id
 WHERE j.join_task_id = s.join_task_id AND s.finished + coalesce(h.n, 0) = s.expected;

-- A join's row now goes with its join task (run_retention); the rows of
-- join tasks already gone go here.
DELETE FROM batonq.joins j
 WHERE NOT EXISTS (SELECT FROM batonq.tasks t WHERE t.id = j.join_task_id)
   AND NOT EXISTS (SELECT FROM batonq.archive a WHERE a.id = j.join_task_id);

INSERT INTO batonq.migrations (version, name) VALUES (5, 'joins');

-- migrations/0006_sessions.sql
-- Dashboard sessions (engine/keys.sql): the dashboard's cookie holds a
-- random token, never the API key; only sha256(token) is stored. A session
-- lasts until it expires, its user signs out, or its key is revoked.
CREATE TABLE batonq.dashboard_sessions (
    token_hash  bytea PRIMARY KEY,
    key_id      bigint NOT NULL REFERENCES batonq.api_keys (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

-- Revoking a key ends its sessions; retention removes the expired ones.
CREATE INDEX dashboard_sessions_key_idx ON batonq.dashboard_sessions (key_id);
CREATE INDEX dashboard_sessions_expires_idx ON batonq.dashboard_sessions (expires_at);

-- Nothing but the engine's functions may touch it.
REVOKE ALL ON batonq.dashboard_sessions FROM PUBLIC;

-- A run's lineage is read a page at a time: run_tasks takes a limit
-- (engine/graph.sql makes the new one).
DROP FUNCTION IF EXISTS batonq.run_tasks(bigint);

INSERT INTO batonq.migrations (version, name) VALUES (6, 'sessions');

-- migrations/0007_due_pages.sql
-- The firer reads the due schedules page by page, by name
-- (engine/schedules.sql makes the new due_schedules).
DROP FUNCTION IF EXISTS batonq.due_schedules(integer);

INSERT INTO batonq.migrations (version, name) VALUES (7, 'due_pages');

-- migrations/0008_leaders.sql
-- batonq 0008: the sweeper's leader is elected by a lease row, not a session
-- advisory lock. A transaction pooler (PgBouncer in transaction mode) hands
-- a server session to other clients between transactions: a session lock
-- taken through it is held by whichever client's server connection took it,
-- outlives the sweeper, and lets every sweeper lead. A row works through any
-- pooler (engine/leaders.sql).

-- One row per duty ('sweeper': sweep, schedules, maintenance; 'vacuum').
-- token grows by one each time the duty changes hands: a fencing token
-- numbering the leaders' terms.
CREATE TABLE batonq.leaders (
    duty       text PRIMARY KEY,
    holder     text NOT NULL,
    token      bigint NOT NULL,
    since      timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
REVOKE ALL ON batonq.leaders FROM PUBLIC;

INSERT INTO batonq.migrations (version, name) VALUES (8, 'leaders');

-- migrations/0009_group_leases.sql
-- batonq 0009: the leases each group holds, kept as they change, so a
-- group-limited claim looks a group's count up by key instead of counting
-- the queue's leases (engine/claim.sql: _pick_in_groups).
--
-- A change of a grouped task into or out of 'leased' adds a row of
-- batonq.group_lease_deltas (a trigger, engine/claim.sql: every path that
-- leases or ends a lease counts, whatever function it is in). Only inserts:
-- concurrent completes never wait on one another for a count. Whoever holds
-- a queue's limits lock (its claims; the sweep) folds the queue's deltas
-- into batonq.group_leases, so that table has one writer per queue and its
-- counts are exact under the lock.

CREATE TABLE batonq.group_leases (
    queue      text NOT NULL,
    group_key  text NOT NULL,
    leased     integer NOT NULL,
    PRIMARY KEY (queue, group_key)
);

CREATE TABLE batonq.group_lease_deltas (
    queue      text NOT NULL,
    group_key  text NOT NULL,
    n          integer NOT NULL
);

CREATE INDEX group_lease_deltas_queue_idx ON batonq.group_lease_deltas (queue);

-- The leases held now. (The trigger that keeps the counts is made by
-- engine/claim.sql; batonq migrate applies the migrations and the engine in
-- one transaction, and the lock keeps leases from starting or ending
-- between this count and the trigger's making until it commits. A block:
-- psql applying this file alone runs it outside a transaction.)
DO $$
BEGIN
    LOCK TABLE batonq.tasks IN SHARE ROW EXCLUSIVE MODE;
    INSERT INTO batonq.group_leases (queue, group_key, leased)
    SELECT queue, group_key, count(*) FROM batonq.tasks
     WHERE state = 'leased' AND group_key IS NOT NULL
     GROUP BY queue, group_key;
END $$;

-- New tables grant nothing to PUBLIC: only the engine's functions touch them.

INSERT INTO batonq.migrations (version, name) VALUES (9, 'group_leases');

-- migrations/0010_row_security.sql
-- Row level security on every batonq table, with no policy: a role that
-- is granted a table anyway (a REST layer's anon or authenticated roles,
-- once the schema is exposed to them) reads and writes no row of it. The
-- engine's functions run as the tables' owner, whom row level security
-- does not bind (ENABLE, not FORCE), so batonq_worker and batonq_reader
-- work as before. Partitions are tables of their own: each gets it too
-- (batonq.ensure_partitions enables it on the ones it makes later).
DO $$
DECLARE
    v_table regclass;
BEGIN
    FOR v_table IN
        SELECT c.oid::regclass FROM pg_class c
         WHERE c.relnamespace = 'batonq'::regnamespace AND c.relkind IN ('r', 'p')
         ORDER BY c.oid
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', v_table);
    END LOOP;
END $$;

INSERT INTO batonq.migrations (version, name) VALUES (10, 'row_security');

-- migrations/0011_service_role.sql
-- batonq_service: the role `batonq serve` (and `batonq mcp`) may run as
-- instead of the schema's owner. A worker's functions, and those of the
-- service's work on behalf of its API keys: checking keys and dashboard
-- sessions, managing keys, settings, schedules and the graph, operator
-- actions. No table, no DDL: every call goes through the engine's
-- SECURITY DEFINER functions (the GRANTs in engine/*.sql), and row level
-- security hides the tables themselves (migrations/0010).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'batonq_service') THEN
        CREATE ROLE batonq_service NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

DO $$
BEGIN
    IF NOT pg_has_role('batonq_service', 'batonq_worker', 'MEMBER') THEN
        GRANT batonq_worker TO batonq_service;
    END IF;
END $$;

GRANT USAGE ON SCHEMA batonq TO batonq_service;

INSERT INTO batonq.migrations (version, name) VALUES (11, 'service_role');

-- migrations/0012_group_full.sql
-- batonq 0012: pending tasks of full groups leave the claim index.
--
-- A group-limited claim (group_max_leased) walks the claim index in claim
-- order and skips the tasks of groups at their limit. With thousands of
-- full groups, every claim read past all their tasks. Now the walk marks
-- what it read past as group_full, and the claim index leaves those rows
-- out, so the next claims do not read them again. A lease of the group that
-- ends gives them back, best first, as many as the group has room for (the
-- fold of the group's lease counts, engine/claim.sql); so does a change of
-- the queue's group_max_leased (all of them), and any change of the task's
-- state (a trigger). group_full is only ever true on a pending task.

ALTER TABLE batonq.tasks ADD COLUMN group_full boolean NOT NULL DEFAULT false;

DROP INDEX batonq.tasks_claim_idx;
CREATE INDEX tasks_claim_idx ON batonq.tasks (queue, priority DESC, run_at, id)
    WHERE state = 'pending' AND NOT group_full;

-- A group's set-aside tasks in claim order, for giving back the best first.
CREATE INDEX tasks_group_full_idx ON batonq.tasks (queue, group_key, priority DESC, run_at, id)
    WHERE group_full;

INSERT INTO batonq.migrations (version, name) VALUES (12, 'group_full');

-- migrations/0013_trace_context.sql
-- batonq 0013: a task carries its enqueuer's trace context.
--
-- trace_context is a W3C trace context carrier ({"traceparent": ...,
-- "tracestate": ...}) taken from the enqueuer's current span when the client
-- has OpenTelemetry, NULL otherwise. A claim returns it, so the worker's span
-- is the enqueuer's child in another process; a completion may replace it in
-- the archive with the context of the run that finished the task, which its
-- batons then carry, so one trace follows a task along the queue graph.
-- Nullable and without a default: adding it rewrites no row.

ALTER TABLE batonq.tasks ADD COLUMN trace_context jsonb;
ALTER TABLE batonq.archive ADD COLUMN trace_context jsonb;
ALTER TYPE batonq.lease ADD ATTRIBUTE trace_context jsonb;

-- Signatures that changed: the enqueues take the enqueuer's context, the
-- queue-first completions the run's, and the archive row both. CASCADE: the
-- SQL-language functions that call them (the token-only complete, ...) go
-- too; the engine, applied after the migrations, makes them all again.
DROP FUNCTION IF EXISTS batonq.enqueue(text, jsonb, integer, double precision, integer, text, boolean, bigint, text) CASCADE;
DROP FUNCTION IF EXISTS batonq.enqueue_deduped(text, jsonb, text, integer, double precision, integer, text) CASCADE;
DROP FUNCTION IF EXISTS batonq.enqueue_many(text, jsonb[], text[], integer[], double precision[], integer, boolean, bigint, text[]) CASCADE;
DROP FUNCTION IF EXISTS batonq.complete_in(text, text, jsonb) CASCADE;
DROP FUNCTION IF EXISTS batonq.complete_many_in(text, text[], jsonb[]) CASCADE;
DROP FUNCTION IF EXISTS batonq.complete_many(text[], jsonb[]) CASCADE;
DROP FUNCTION IF EXISTS batonq._archive_row(batonq.tasks, text, jsonb, text, jsonb) CASCADE;

INSERT INTO batonq.migrations (version, name) VALUES (13, 'trace_context');

-- engine/helpers.sql
-- batonq engine: helpers shared by the engine's functions. Not granted to the
-- worker or reader roles: only the engine calls them.
--
-- Errors raised by the engine carry their own SQLSTATEs (class BQ) and a JSON
-- DETAIL, which clients map to their exceptions:
--   BQ001 invalid_queue_name   BQ002 task_not_found   BQ003 too_large
--   BQ004 invalid_argument     BQ005 invalid_token    BQ006 queue_not_found
--   BQ007 invalid_state        BQ008 graph_cycle      BQ009 key_not_found
--   BQ010 json_too_deep        BQ011 number_too_large
-- A write refused because its lease is gone is not an error here: it is a
-- reply with outcome 'lease_lost', so the refusal can be recorded in the
-- submit ledger in the same transaction.

CREATE OR REPLACE FUNCTION batonq._check_queue_name(p_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_name IS NULL OR NOT batonq._valid_queue_name(p_name) THEN
        RAISE EXCEPTION 'invalid queue name %: use 1-128 characters from a-z 0-9 _ . : - starting with a letter or digit',
                        coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'BQ001', DETAIL = jsonb_build_object('queue', p_name)::text;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION batonq._invalid_argument(p_message text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = 'BQ004';
END $$;

-- JSON bodies (payload, result, error) are limited by their size as compact
-- JSON text (UTF-8, no spaces between tokens), by how deep they nest and by
-- how long their numbers are. Deeper nesting and longer numbers are refused
-- because they could be stored but not served: on the way out pydantic and
-- orjson give up past 255 levels, Python's json past its recursion limit
-- (about 1,000), Python's int past 4,300 digits, a double past 1.8e308. The
-- limits leave room for the levels a reply wraps around a payload, a join's
-- list around its elements' results and a task's errors around an error.
CREATE OR REPLACE FUNCTION batonq._max_json_depth() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 64;

-- Numbers must be below 1e300 in magnitude: at most 300 digits before the
-- decimal point.
CREATE OR REPLACE FUNCTION batonq._max_number_digits() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 300;

-- p_text (jsonb's text form) measured as compact JSON: jsonb writes one
-- space after every ',' and ':' between tokens and no other space outside
-- strings, so the spaces left once the strings are cut out are the extra
-- bytes. Escaped backslashes and quotes go first, so every '"' left opens
-- or closes a string.
CREATE OR REPLACE FUNCTION batonq._compact_size(p_text text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT octet_length(p_text) - (octet_length(x.outside) - octet_length(replace(x.outside, ' ', '')))
          FROM (SELECT regexp_replace(replace(replace(p_text, '\\', ''), '\"', ''), '"[^"]*"', '', 'g')
                       AS outside) x);

-- The containers p_level levels down: a body that has one nests deeper than
-- p_level. IMMUTABLE, so that with a constant level the path is made once,
-- when the calling statement is planned, and not parsed again per call.
CREATE OR REPLACE FUNCTION batonq._nesting_path(p_level integer) RETURNS jsonpath
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN format('strict $.**{%s} ? (@.type() == "array" || @.type() == "object")', p_level)::jsonpath;

-- .abs() rather than .type() == "number": a third of the time on a 100 KiB
-- payload (a string's .abs() is an error, which the filter takes as false).
CREATE OR REPLACE FUNCTION batonq._huge_numbers() RETURNS jsonpath
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN format('strict $.** ? (@.abs() >= 1e%s)', batonq._max_number_digits())::jsonpath;

-- Whether p_body may be stored (size, depth, numbers). The text is made once;
-- the costlier looks run only where the text could fail them: nesting 65
-- levels takes 130 bytes, and jsonb writes every number out in full, so one
-- of 1e300 or more shows as a run of digits (255, as many as a regex counts)
-- that the text search finds in a quarter of the time of the walk.
-- p_text is p_body::text, made once by the caller.
CREATE OR REPLACE FUNCTION batonq._json_fits(p_body jsonb, p_text text, p_limit integer) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_size integer := octet_length(p_text);
BEGIN
    IF p_body IS NULL OR v_size < 2 * batonq._max_json_depth() + 2 THEN
        RETURN v_size IS NULL OR v_size <= p_limit OR batonq._compact_size(p_text) <= p_limit;
    END IF;
    RETURN (v_size <= p_limit OR batonq._compact_size(p_text) <= p_limit)
       AND NOT jsonb_path_exists(p_body, batonq._nesting_path(batonq._max_json_depth()))
       AND NOT (p_text ~ '[0-9]{255}' AND jsonb_path_exists(p_body, batonq._huge_numbers()));
END $$;

-- Refuse what _json_fits refuses, saying why: BQ003 for the size (as
-- compact JSON), BQ010 for the depth, BQ011 for a number.
CREATE OR REPLACE FUNCTION batonq._check_json(p_what text, p_body jsonb, p_limit integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_text  text := p_body::text;
    v_size  integer := octet_length(v_text);
    v_low   integer;
    v_high  integer;
    v_mid   integer;
    v_huge  numeric;
BEGIN
    -- Most bodies are short: no further call for them.
    IF p_body IS NULL OR (v_size <= p_limit AND v_size < 2 * batonq._max_json_depth() + 2)
       OR batonq._json_fits(p_body, v_text, p_limit) THEN
        RETURN;
    END IF;
    v_size := batonq._compact_size(v_text);
    IF v_size > p_limit THEN
        RAISE EXCEPTION '% is % bytes as compact JSON, over the limit of % bytes', p_what, v_size, p_limit
            USING ERRCODE = 'BQ003',
                  DETAIL = jsonb_build_object('what', p_what, 'size', v_size, 'limit', p_limit)::text;
    END IF;
    IF jsonb_path_exists(p_body, batonq._nesting_path(batonq._max_json_depth())) THEN
        -- The depth, for the message: it is over the limit, and every level
        -- takes two bytes of text.
        v_low := batonq._max_json_depth() + 1;
        v_high := v_size / 2;
        WHILE v_low < v_high LOOP
            v_mid := (v_low + v_high + 1) / 2;
            IF jsonb_path_exists(p_body, batonq._nesting_path(v_mid - 1)) THEN
                v_low := v_mid;
            ELSE
                v_high := v_mid - 1;
            END IF;
        END LOOP;
        RAISE EXCEPTION '% nests % levels deep; the limit is %', p_what, v_low, batonq._max_json_depth()
            USING ERRCODE = 'BQ010',
                  DETAIL = jsonb_build_object('what', p_what, 'depth', v_low,
                                              'limit', batonq._max_json_depth())::text;
    END IF;
    v_huge := jsonb_path_query_first(p_body, batonq._huge_numbers())::numeric;
    v_size := length(trunc(abs(v_huge))::text);
    RAISE EXCEPTION '% holds a number with % digits before the decimal point; the limit is %',
                    p_what, v_size, batonq._max_number_digits()
        USING ERRCODE = 'BQ011',
              DETAIL = jsonb_build_object('what', p_what, 'digits', v_size,
                                          'limit', batonq._max_number_digits())::text;
END $$;

-- A queue's settings; enqueue creates a queue on first use.
CREATE OR REPLACE FUNCTION batonq._queue(p_queue text, p_create boolean) RETURNS batonq.queues
LANGUAGE plpgsql AS $$
DECLARE
    v_queue batonq.queues;
BEGIN
    SELECT * INTO v_queue FROM batonq.queues WHERE name = p_queue;
    IF FOUND THEN
        RETURN v_queue;
    END IF;
    PERFORM batonq._check_queue_name(p_queue);
    IF NOT p_create THEN
        RAISE EXCEPTION 'queue % does not exist', p_queue
            USING ERRCODE = 'BQ006', DETAIL = jsonb_build_object('queue', p_queue)::text;
    END IF;
    INSERT INTO batonq.queues (name) VALUES (p_queue) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO STRICT v_queue FROM batonq.queues WHERE name = p_queue;
    RETURN v_queue;
END $$;

-- Casts, not bigint || text: that operator is only STABLE, and an IMMUTABLE
-- function calling it is not inlined (a function call per claimed row).
CREATE OR REPLACE FUNCTION batonq._lease_token(p_queue text, p_task_id bigint, p_fencing_token bigint, p_secret uuid)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_queue || '/' || p_task_id::text || '/' || p_fencing_token::text || '/'
       || replace(p_secret::text, '-', '');

-- STABLE, not VOLATILE, so that _parse_token may be inlined; with no
-- arguments it is never folded at plan time.
CREATE OR REPLACE FUNCTION batonq._malformed_token() RETURNS batonq.lease_ref
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RAISE EXCEPTION 'malformed lease token: use the lease_token returned by claim'
        USING ERRCODE = 'BQ005';
END $$;

-- A SQL function the planner inlines (so STABLE, like everything in it).
-- split_part rather than capture groups, and unbounded repeats with the
-- lengths checked apart: a pattern with bounded repeats ({1,18}, {32}) costs
-- about 7 us a token against 1 us, which was a quarter of a batch complete.
CREATE OR REPLACE FUNCTION batonq._parse_token(p_token text) RETURNS batonq.lease_ref
LANGUAGE sql STABLE
RETURN CASE
    WHEN p_token ~ '^[a-z0-9][-a-z0-9_.:]*/[0-9]+/[0-9]+/[0-9a-f]+$'
         AND length(split_part(p_token, '/', 1)) <= 128
         AND length(split_part(p_token, '/', 2)) <= 18 AND length(split_part(p_token, '/', 3)) <= 18
         AND length(split_part(p_token, '/', 4)) = 32
    THEN ROW(split_part(p_token, '/', 1), split_part(p_token, '/', 2)::bigint,
             split_part(p_token, '/', 3)::bigint, split_part(p_token, '/', 4)::uuid)::batonq.lease_ref
    ELSE batonq._malformed_token()
END;

-- A lease token for a call that names its queue first (complete_in and the
-- other writes, which a sharded deployment routes by that argument): a token
-- of another queue is refused like a forged one, since its task is not there.
CREATE OR REPLACE FUNCTION batonq._foreign_token(p_queue text, p_token text) RETURNS batonq.lease_ref
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM batonq._parse_token(p_token);  -- a malformed token says so first
    RAISE EXCEPTION 'lease token of queue %, not %', split_part(p_token, '/', 1), p_queue
        USING ERRCODE = 'BQ005';
END $$;

CREATE OR REPLACE FUNCTION batonq._parse_token_in(p_queue text, p_token text) RETURNS batonq.lease_ref
LANGUAGE sql STABLE
RETURN CASE
    WHEN split_part(p_token, '/', 1) = p_queue THEN batonq._parse_token(p_token)
    ELSE batonq._foreign_token(p_queue, p_token)
END;

-- The text an error body shows as last_error.
CREATE OR REPLACE FUNCTION batonq._error_text(p_error jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE jsonb_typeof(p_error) WHEN 'string' THEN p_error #>> '{}' ELSE p_error::text END;

-- One entry of a task's attempt history, with who held the lease (its
-- worker and the API key that claimed it) and when it began: a write set
-- aside later under that fencing token is shown with them
-- (batonq.set_aside_writes), and the dashboard shows every attempt's worker,
-- start and end ('at').
CREATE OR REPLACE FUNCTION batonq._attempt_error(p_attempt integer, p_fencing_token bigint, p_error jsonb,
                                      p_worker text DEFAULT NULL, p_key_id bigint DEFAULT NULL,
                                      p_started_at timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object('attempt', p_attempt, 'fencing_token', p_fencing_token,
                          'at', now(), 'error', p_error, 'worker', p_worker, 'key_id', p_key_id,
                          'started_at', p_started_at);

-- Exponential backoff with jitter: base * 2^(attempt-1), capped, then scaled
-- by a random factor in [0.5, 1) so failed tasks do not retry in lockstep.
CREATE OR REPLACE FUNCTION batonq._backoff_s(p_queue batonq.queues, p_attempt integer) RETURNS double precision
LANGUAGE sql VOLATILE
RETURN least(p_queue.backoff_max_s,
             p_queue.backoff_base_s * power(2, least(greatest(p_attempt, 1) - 1, 60)))
       * (0.5 + random() / 2);

-- A hot row as it enters the archive, finished in p_state. NULL for
-- p_last_error or p_errors keeps the row's own.
-- p_trace_context: the context of the run that finished the task (its
-- batons carry it), when the finisher gave one; else the enqueuer's.
CREATE OR REPLACE FUNCTION batonq._archive_row(t batonq.tasks, p_state text, p_result jsonb,
                                    p_last_error text DEFAULT NULL, p_errors jsonb DEFAULT NULL,
                                    p_trace_context jsonb DEFAULT NULL)
RETURNS batonq.archive
LANGUAGE sql STABLE
RETURN ROW(t.id, t.queue, p_state, t.priority, t.run_at, t.created_at, t.payload, t.attempts,
           t.max_attempts, t.idempotency_key, t.parent_id, t.root_id, t.fencing_token,
           t.claimed_at, t.worker, t.stage, coalesce(p_last_error, t.last_error),
           coalesce(p_errors, t.errors), t.join_task_id, t.fan_index, p_result, now(),
           t.lease_secret, t.claim_key, t.group_key,
           coalesce(p_trace_context, t.trace_context))::batonq.archive;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;

-- Whether a task in p_state, due at p_run_at, is what a list asks for:
-- p_wanted names a state, or 'scheduled' (pending, not due yet); NULL asks
-- for every task. SQL, so the planner inlines it into the list's filter.
CREATE OR REPLACE FUNCTION batonq._in_state(p_state text, p_run_at timestamptz, p_wanted text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_wanted IS NULL OR p_state = p_wanted
        OR (p_wanted = 'scheduled' AND p_state = 'pending' AND p_run_at > now())
$$;

-- engine/wake.sql
-- batonq engine: wake-ups. Enqueues notify the claimers waiting on a queue
-- (LISTEN batonq), only while someone waits (batonq.awaited).

-- Wake the claimers waiting for a queue that has a task claimable now.
-- NOTIFY goes out only while someone awaits the queue: every commit that
-- notifies takes one database-wide lock, so unconditional NOTIFYs line busy
-- producers' commits up one behind the other.
--
-- The look cannot miss a waiter that registers meanwhile: it is made under
-- a shared lock that batonq.await_work takes exclusively. Either the
-- registration waits for this transaction to commit (and the waiter, which
-- looks for work once more after registering, sees this task), or it
-- committed before the look below took its snapshot. A registration under
-- way (the lock is taken or asked for) gets a NOTIFY without a look: the
-- enqueue never waits for a waiter. Above READ COMMITTED the snapshot may
-- predate a registration: such a transaction notifies without looking.
CREATE OR REPLACE FUNCTION batonq._wake(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND pg_try_advisory_xact_lock_shared(hashtext('batonq.awaited'), hashtext(p_queue)) THEN
        -- A new statement, so a snapshot taken with the lock held.
        IF NOT EXISTS (SELECT FROM batonq.awaited WHERE queue = p_queue AND until > now()) THEN
            RETURN;
        END IF;
    END IF;
    PERFORM pg_notify('batonq', p_queue);
END $$;

-- Ask for wake-ups: until p_for_s seconds from now, every transaction that
-- makes a task of p_queue claimable now sends NOTIFY batonq, '<queue>'.
-- Register while LISTENing, then look for work once more before sleeping:
-- a task that became claimable before the registration committed did not
-- notify. The lock waits for the enqueues that are looking for waiters
-- right now (batonq._wake) to commit, so that look sees their tasks. A
-- transaction that enqueued and stays open (the caller's own, around an
-- enqueue) is not waited for beyond lock_timeout: its task is found by the
-- waiters' next poll.
CREATE OR REPLACE FUNCTION batonq.await_work(p_queue text, p_for_s double precision) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET lock_timeout = '500ms' AS $$
DECLARE
    v_until timestamptz;
BEGIN
    PERFORM batonq._check_queue_name(p_queue);
    IF p_for_s IS NULL OR p_for_s <= 0 OR p_for_s > 3600 THEN
        PERFORM batonq._invalid_argument('for_s must be above 0 and at most 3600');
    END IF;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('batonq.awaited'), hashtext(p_queue));
    EXCEPTION WHEN lock_not_available THEN
        NULL;  -- register all the same: later enqueues see it
    END;
    INSERT INTO batonq.awaited AS a (queue, until)
    VALUES (p_queue, clock_timestamp() + make_interval(secs => p_for_s))
    ON CONFLICT (queue) DO UPDATE SET until = greatest(a.until, excluded.until)
    RETURNING a.until INTO v_until;
    RETURN v_until;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.await_work(text, double precision) TO batonq_reader;

-- engine/enqueue.sql
-- batonq engine: queues and enqueue.

-- A limit's new value, named p_name: NULL (keep), 0 (remove) or 1 and more.
CREATE OR REPLACE FUNCTION batonq._check_limit(p_name text, p_value integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_value < 0 THEN
        PERFORM batonq._invalid_argument(
            format('%s must be 1 or more, or 0 for no limit (got %s)', p_name, p_value));
    END IF;
END $$;

-- Create a queue or change its settings; a NULL argument keeps the current
-- value (or the default, for a new queue). For the limits (max_leased,
-- group_max_leased, rate_limit, group_rate_limit) 0 removes the limit. p_actor names who acts
-- (a service's API key) in the settings audit; NULL: the database role.
CREATE OR REPLACE FUNCTION batonq.configure_queue(
    p_queue            text,
    p_lease_s          integer DEFAULT NULL,
    p_max_attempts     integer DEFAULT NULL,
    p_backoff_base_s   double precision DEFAULT NULL,
    p_backoff_max_s    double precision DEFAULT NULL,
    p_retention_s      integer DEFAULT NULL,
    p_max_body_bytes   integer DEFAULT NULL,
    p_paused           boolean DEFAULT NULL,
    p_max_leased       integer DEFAULT NULL,
    p_group_max_leased integer DEFAULT NULL,
    p_rate_limit       integer DEFAULT NULL,
    p_rate_period_s    double precision DEFAULT NULL,
    p_group_rate_limit integer DEFAULT NULL,
    p_actor            text DEFAULT NULL
) RETURNS batonq.queues
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_queue  batonq.queues;
    v_before batonq.queues;
BEGIN
    PERFORM batonq._check_limit('max_leased', p_max_leased);
    PERFORM batonq._check_limit('group_max_leased', p_group_max_leased);
    PERFORM batonq._check_limit('rate_limit', p_rate_limit);
    PERFORM batonq._check_limit('group_rate_limit', p_group_rate_limit);
    -- From a millisecond: a shorter period overflows the buckets' arithmetic.
    IF p_rate_period_s < 0.001 OR p_rate_period_s > 86400 OR p_rate_period_s = 'NaN' THEN
        PERFORM batonq._invalid_argument(
            format('rate_period_s must be between 0.001 and 86400 seconds (got %s)', p_rate_period_s));
    END IF;
    PERFORM batonq._act_as(p_actor);
    PERFORM batonq._queue(p_queue, true);
    -- Read again, locked: the values this change replaces, not ones a
    -- concurrent change has since replaced (the buckets' reset depends on them).
    SELECT * INTO v_before FROM batonq.queues WHERE name = p_queue FOR UPDATE;
    UPDATE batonq.queues SET
        lease_s          = coalesce(p_lease_s, lease_s),
        max_attempts     = coalesce(p_max_attempts, max_attempts),
        backoff_base_s   = coalesce(p_backoff_base_s, backoff_base_s),
        backoff_max_s    = coalesce(p_backoff_max_s, backoff_max_s),
        retention_s      = coalesce(p_retention_s, retention_s),
        max_body_bytes   = coalesce(p_max_body_bytes, max_body_bytes),
        paused           = coalesce(p_paused, paused),
        max_leased       = CASE WHEN p_max_leased IS NULL THEN max_leased ELSE nullif(p_max_leased, 0) END,
        group_max_leased = CASE WHEN p_group_max_leased IS NULL THEN group_max_leased
                                ELSE nullif(p_group_max_leased, 0) END,
        rate_limit       = CASE WHEN p_rate_limit IS NULL THEN rate_limit ELSE nullif(p_rate_limit, 0) END,
        group_rate_limit = CASE WHEN p_group_rate_limit IS NULL THEN group_rate_limit
                                ELSE nullif(p_group_rate_limit, 0) END,
        rate_period_s    = coalesce(p_rate_period_s, rate_period_s)
    WHERE name = p_queue
    RETURNING * INTO v_queue;
    PERFORM batonq._act_as(NULL);
    -- A new rate starts with full buckets; the same rate sent again (a
    -- deployment applying its settings) leaves them as they are.
    IF (v_queue.rate_limit, v_queue.rate_period_s)
       IS DISTINCT FROM (v_before.rate_limit, v_before.rate_period_s) THEN
        DELETE FROM batonq.rate_buckets WHERE queue = p_queue;
    END IF;
    IF (v_queue.group_rate_limit, v_queue.rate_period_s)
       IS DISTINCT FROM (v_before.group_rate_limit, v_before.rate_period_s) THEN
        DELETE FROM batonq.group_rate_buckets WHERE queue = p_queue;
    END IF;
    -- Another group limit: the tasks set aside under the old one
    -- (group_full, engine/claim.sql) are claimable again, and the next
    -- claims set aside what is full under the new one. Under the limits
    -- lock, so no claim still walking with the old limit sets one aside after.
    IF v_queue.group_max_leased IS DISTINCT FROM v_before.group_max_leased THEN
        PERFORM batonq._limits_lock(p_queue);
        UPDATE batonq.tasks t SET group_full = false WHERE t.queue = p_queue AND t.group_full;
    END IF;
    -- Unpaused, or a limit raised or removed: claims may find tasks now.
    IF p_paused IS FALSE OR p_max_leased IS NOT NULL OR p_group_max_leased IS NOT NULL
       OR p_rate_limit IS NOT NULL OR p_group_rate_limit IS NOT NULL
       OR p_rate_period_s IS NOT NULL THEN
        PERFORM batonq._wake(p_queue);
    END IF;
    RETURN v_queue;
EXCEPTION WHEN check_violation THEN
    RAISE EXCEPTION 'invalid queue setting: lease_s 1-3600, max_attempts 1-1000, backoff and retention >= 0, max_body_bytes >= 1'
        USING ERRCODE = 'BQ004';
END $$;

-- A task's group: NULL (none) or 1-128 characters.
CREATE OR REPLACE FUNCTION batonq._valid_group(p_group text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_group IS NULL OR length(p_group) BETWEEN 1 AND 128;

CREATE OR REPLACE FUNCTION batonq._check_group(p_group text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT batonq._valid_group(p_group) THEN
        PERFORM batonq._invalid_argument(format('group must be 1-128 characters (got %s)', length(p_group)));
    END IF;
END $$;

-- The root of the run a new child joins: its parent's root.
CREATE OR REPLACE FUNCTION batonq._root_of(p_parent_id bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_root bigint;
BEGIN
    SELECT root_id INTO v_root FROM batonq.tasks WHERE id = p_parent_id;
    IF NOT FOUND THEN
        SELECT root_id INTO v_root FROM batonq.archive WHERE id = p_parent_id;
    END IF;
    IF v_root IS NULL THEN
        RAISE EXCEPTION 'parent task % not found', p_parent_id
            USING ERRCODE = 'BQ002', DETAIL = jsonb_build_object('task_id', p_parent_id)::text;
    END IF;
    RETURN v_root;
END $$;

CREATE OR REPLACE FUNCTION batonq._check_enqueue_args(p_priority integer, p_delay_s double precision, p_max_attempts integer)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_delay_s IS NULL OR p_delay_s < 0 OR p_delay_s > 315360000 THEN
        PERFORM batonq._invalid_argument('delay_s must be between 0 and 315360000 (10 years)');
    END IF;
    IF p_max_attempts IS NOT NULL AND (p_max_attempts < 1 OR p_max_attempts > 1000) THEN
        PERFORM batonq._invalid_argument('max_attempts must be between 1 and 1000');
    END IF;
    IF p_priority IS NULL THEN
        PERFORM batonq._invalid_argument('priority must be an integer');
    END IF;
END $$;

-- Enqueue one task. With an idempotency key, the first task to take the key
-- in this queue is returned to every later caller (created = false) for as
-- long as it is retained. A task claimable now wakes the queue's waiters
-- (batonq._wake) -- every time: "only when none was claimable before" was
-- tried and loses wake-ups (an enqueue that saw a pending task, which a
-- claimer then took with a snapshot older than the enqueue's commit, leaves
-- its own task to the claimer's next poll).
CREATE OR REPLACE FUNCTION batonq.enqueue(
    p_queue           text,
    p_payload         jsonb,
    p_priority        integer DEFAULT 0,
    p_delay_s         double precision DEFAULT 0,
    p_max_attempts    integer DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL,
    p_held            boolean DEFAULT false,
    p_parent_id       bigint DEFAULT NULL,
    p_group           text DEFAULT NULL,
    p_trace_context   jsonb DEFAULT NULL
) RETURNS batonq.enqueued
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_queue  batonq.queues := batonq._queue(p_queue, true);
    v_id     bigint := nextval('batonq.task_id_seq');
    v_state  text := CASE WHEN p_held THEN 'held' ELSE 'pending' END;
    v_reply  batonq.enqueued;
BEGIN
    PERFORM batonq._check_enqueue_args(p_priority, p_delay_s, p_max_attempts);
    PERFORM batonq._check_group(p_group);
    PERFORM batonq._check_json('payload', p_payload, v_queue.max_body_bytes);
    IF p_idempotency_key IS NOT NULL THEN
        INSERT INTO batonq.idempotency_keys (queue, key, task_id)
        VALUES (p_queue, p_idempotency_key, v_id)
        ON CONFLICT (queue, key) DO NOTHING;
        IF NOT FOUND THEN
            -- A new statement, so a new snapshot: it sees the winner's row
            -- even when the winner committed while we waited on it.
            SELECT k.task_id, p_queue, false, coalesce(t.state, a.state), coalesce(t.run_at, a.run_at)
              INTO v_reply
              FROM batonq.idempotency_keys k
              LEFT JOIN batonq.tasks t ON t.queue = p_queue AND t.id = k.task_id
              LEFT JOIN batonq.archive a ON t.id IS NULL AND a.id = k.task_id
             WHERE k.queue = p_queue AND k.key = p_idempotency_key;
            RETURN v_reply;
        END IF;
    END IF;
    INSERT INTO batonq.tasks (id, queue, state, priority, run_at, payload, max_attempts,
                              idempotency_key, parent_id, root_id, group_key, trace_context)
    VALUES (v_id, p_queue, v_state, p_priority, now() + make_interval(secs => p_delay_s), p_payload,
            coalesce(p_max_attempts, v_queue.max_attempts), p_idempotency_key, p_parent_id,
            CASE WHEN p_parent_id IS NULL THEN v_id ELSE batonq._root_of(p_parent_id) END, p_group,
            p_trace_context)
    RETURNING id, queue, true, state, run_at INTO v_reply;
    IF v_state = 'pending' AND p_delay_s = 0 THEN
        PERFORM batonq._wake(p_queue);
    END IF;
    RETURN v_reply;
END $$;

-- Enqueue one task under a dedupe key: an idempotency key held only while
-- its task is unfinished. The key of a task that is done, dead or cancelled
-- (no longer in the hot table) is let go first, so the same key enqueues a
-- new task, where batonq.enqueue would return the finished one until
-- retention drops it. Two callers at once: the first to let the key go
-- takes it for its new task; the other's DELETE waits on that row, finds
-- it gone, and batonq.enqueue's next statement sees the new task's key.
CREATE OR REPLACE FUNCTION batonq.enqueue_deduped(
    p_queue        text,
    p_payload      jsonb,
    p_dedupe_key   text,
    p_priority     integer DEFAULT 0,
    p_delay_s      double precision DEFAULT 0,
    p_max_attempts  integer DEFAULT NULL,
    p_group         text DEFAULT NULL,
    p_trace_context jsonb DEFAULT NULL
) RETURNS batonq.enqueued
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
BEGIN
    IF p_dedupe_key IS NULL THEN
        PERFORM batonq._invalid_argument('dedupe_key must not be null');
    END IF;
    DELETE FROM batonq.idempotency_keys k
     WHERE k.queue = p_queue AND k.key = p_dedupe_key
       AND NOT EXISTS (SELECT FROM batonq.tasks t WHERE t.queue = p_queue AND t.id = k.task_id);
    RETURN batonq.enqueue(p_queue, p_payload, p_priority, p_delay_s, p_max_attempts, p_dedupe_key,
                          false, NULL, p_group, p_trace_context);
END $$;

-- Enqueue many tasks into one queue in one call (10,000 is fine). The
-- arrays run in parallel: payloads, and optionally idempotency keys,
-- priorities, delays and groups (NULL or a shorter array means
-- none/0/0/none). One row
-- comes back per payload, in order (ord counts from 1); a key repeated
-- within the batch yields one task.
CREATE OR REPLACE FUNCTION batonq.enqueue_many(
    p_queue            text,
    p_payloads         jsonb[],
    p_idempotency_keys text[] DEFAULT NULL,
    p_priorities       integer[] DEFAULT NULL,
    p_delays_s         double precision[] DEFAULT NULL,
    p_max_attempts     integer DEFAULT NULL,
    p_held             boolean DEFAULT false,
    p_parent_id        bigint DEFAULT NULL,
    p_groups           text[] DEFAULT NULL,
    p_trace_context    jsonb DEFAULT NULL
) RETURNS TABLE (ord integer, task_id bigint, queue text, created boolean, state text, run_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_queue  batonq.queues := batonq._queue(p_queue, true);
    v_n      integer := coalesce(cardinality(p_payloads), 0);
    v_ids    bigint[];
    v_state  text := CASE WHEN p_held THEN 'held' ELSE 'pending' END;
    v_root   bigint := CASE WHEN p_parent_id IS NOT NULL THEN batonq._root_of(p_parent_id) END;
    v_bad    integer;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF cardinality(p_idempotency_keys) > v_n OR cardinality(p_priorities) > v_n
       OR cardinality(p_delays_s) > v_n OR cardinality(p_groups) > v_n THEN
        PERFORM batonq._invalid_argument('idempotency_keys, priorities, delays_s and groups may not be longer than payloads');
    END IF;
    PERFORM batonq._check_enqueue_args(0, 0, p_max_attempts);
    SELECT g.ord INTO v_bad FROM unnest(p_groups) WITH ORDINALITY AS g(name, ord)
     WHERE NOT batonq._valid_group(g.name) LIMIT 1;
    IF v_bad IS NOT NULL THEN
        PERFORM batonq._check_group(p_groups[v_bad]);
    END IF;
    -- Each body's text is made once (OFFSET 0 keeps the subquery from being
    -- folded into two casts); a short one needs no call of _json_fits.
    SELECT i.ord INTO v_bad
      FROM unnest(p_payloads, p_delays_s) WITH ORDINALITY AS i(body, delay_s, ord),
           LATERAL (SELECT i.body::text AS txt OFFSET 0) x
     WHERE i.body IS NULL
        OR (octet_length(x.txt) >= least(v_queue.max_body_bytes + 1, 2 * batonq._max_json_depth() + 2)
            AND NOT batonq._json_fits(i.body, x.txt, v_queue.max_body_bytes))
        OR i.delay_s < 0 OR i.delay_s > 315360000
     LIMIT 1;
    IF v_bad IS NOT NULL THEN
        IF p_payloads[v_bad] IS NULL THEN
            PERFORM batonq._invalid_argument(format('payload %s is NULL', v_bad));
        END IF;
        PERFORM batonq._check_json(format('payload %s', v_bad), p_payloads[v_bad], v_queue.max_body_bytes);
        PERFORM batonq._check_enqueue_args(0, p_delays_s[v_bad], NULL);
    END IF;

    v_ids := ARRAY(SELECT nextval('batonq.task_id_seq') FROM generate_series(1, v_n));

    IF p_idempotency_keys IS NULL THEN
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO batonq.tasks (id, queue, state, priority, run_at, payload, max_attempts,
                                      parent_id, root_id, group_key, trace_context)
            SELECT i.id, p_queue, v_state, coalesce(i.priority, 0),
                   now() + make_interval(secs => coalesce(i.delay_s, 0)), i.body,
                   coalesce(p_max_attempts, v_queue.max_attempts), p_parent_id, coalesce(v_root, i.id),
                   i.group_key, p_trace_context
              FROM unnest(p_payloads, v_ids, p_priorities, p_delays_s, p_groups)
                   AS i(body, id, priority, delay_s, group_key)
            RETURNING id, queue, state, run_at
        )
        SELECT o.ord::integer, i.id, i.queue, true, i.state, i.run_at
          FROM inserted i JOIN unnest(v_ids) WITH ORDINALITY AS o(id, ord) ON o.id = i.id
         ORDER BY o.ord;
    ELSE
        -- Take the keys first; rows whose key is already taken (by another
        -- transaction, or earlier in this batch) insert no task.
        WITH input AS (
            SELECT i.*, row_number() OVER (PARTITION BY i.key ORDER BY i.ord) AS nth
              FROM unnest(p_payloads, v_ids, p_idempotency_keys, p_priorities, p_delays_s, p_groups)
                   WITH ORDINALITY AS i(body, id, key, priority, delay_s, group_key, ord)
        ), taken AS (
            -- In key order, so two batches with overlapping keys wait on each
            -- other in the same order and cannot deadlock.
            INSERT INTO batonq.idempotency_keys (queue, key, task_id)
            SELECT p_queue, i.key, i.id FROM input i WHERE i.key IS NOT NULL AND i.nth = 1
             ORDER BY i.key
            ON CONFLICT (queue, key) DO NOTHING
            RETURNING task_id
        )
        INSERT INTO batonq.tasks (id, queue, state, priority, run_at, payload, max_attempts,
                                  idempotency_key, parent_id, root_id, group_key, trace_context)
        SELECT i.id, p_queue, v_state, coalesce(i.priority, 0),
               now() + make_interval(secs => coalesce(i.delay_s, 0)), i.body,
               coalesce(p_max_attempts, v_queue.max_attempts), i.key, p_parent_id, coalesce(v_root, i.id),
               i.group_key, p_trace_context
          FROM input i
         WHERE i.key IS NULL OR i.id IN (SELECT t.task_id FROM taken t);

        -- A new statement sees keys that other transactions committed while
        -- this one waited on them.
        RETURN QUERY
        SELECT i.ord::integer, coalesce(k.task_id, i.id), p_queue, coalesce(k.task_id, i.id) = i.id,
               coalesce(t.state, a.state), coalesce(t.run_at, a.run_at)
          FROM unnest(v_ids, p_idempotency_keys) WITH ORDINALITY AS i(id, key, ord)
          LEFT JOIN batonq.idempotency_keys k ON k.queue = p_queue AND k.key = i.key
          LEFT JOIN batonq.tasks t ON t.queue = p_queue AND t.id = coalesce(k.task_id, i.id)
          LEFT JOIN LATERAL (SELECT a.state, a.run_at FROM batonq.archive a
                              WHERE t.id IS NULL AND a.id = k.task_id LIMIT 1) a ON true
         ORDER BY i.ord;
    END IF;
    -- Claimable now when some task has no delay (a delays_s shorter than the
    -- payloads leaves the rest at 0).
    IF v_state = 'pending' AND (coalesce(cardinality(p_delays_s), 0) < v_n
                                OR EXISTS (SELECT FROM unnest(p_delays_s) AS d WHERE coalesce(d, 0) = 0)) THEN
        PERFORM batonq._wake(p_queue);
    END IF;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    batonq.enqueue(text, jsonb, integer, double precision, integer, text, boolean, bigint, text, jsonb),
    batonq.enqueue_deduped(text, jsonb, text, integer, double precision, integer, text, jsonb),
    batonq.enqueue_many(text, jsonb[], text[], integer[], double precision[], integer, boolean, bigint, text[], jsonb)
TO batonq_worker;
GRANT EXECUTE ON FUNCTION
    batonq.configure_queue(text, integer, integer, double precision, double precision, integer, integer, boolean,
                           integer, integer, integer, double precision, integer, text)
TO batonq_service;

-- engine/claim.sql
-- batonq engine: claim, lease expiry and the sweep.

-- Statements that find rows by id (id = ANY (...)) test a state as
-- "NOT IN (the other states)", never as "state = 'x'": the latter would let
-- the planner read a partial index of that state (the claim index, the
-- lease index) by queue with the ids as a filter, the whole queue's backlog
-- on every call; with no statistics (a new database, a bulk load not yet
-- analyzed) it does. The states are those of batonq.tasks' CHECK.

-- Return the expired leases of one queue: to pending while attempts remain
-- (keeping the old fencing token, so the old holder may still finish if
-- nobody claims it first), else to the archive as dead. Every statement names
-- the queue, so it reads one partition; the rows it picked are found again
-- by the primary key (the state test above).
CREATE OR REPLACE FUNCTION batonq.expire_leases(p_queue text, p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ids    bigint[];
    v_count  integer;
    v_joined bigint[];
BEGIN
    v_ids := ARRAY(
        SELECT id FROM batonq.tasks
         WHERE queue = p_queue AND state = 'leased' AND lease_expires_at < now()
         ORDER BY lease_expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED);
    IF cardinality(v_ids) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE batonq.tasks t SET
        state = 'pending',
        lease_expires_at = NULL,
        last_error = 'lease expired',
        errors = t.errors || batonq._attempt_error(t.attempts, t.fencing_token, '"lease expired"',
                                                   t.worker, t.claim_key, t.claimed_at)
     WHERE t.queue = p_queue AND t.id = ANY (v_ids) AND t.attempts < t.max_attempts;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM batonq._wake(p_queue);
    ELSE
        PERFORM batonq._lease_ended(p_queue);  -- dead ones free a limit's room
    END IF;
    WITH dead AS (
        DELETE FROM batonq.tasks t
         WHERE t.queue = p_queue AND t.id = ANY (v_ids) AND t.state NOT IN ('waiting', 'held', 'pending')
        RETURNING t
    ), archived AS (
        INSERT INTO batonq.archive
        SELECT (batonq._archive_row(d.t, 'dead', NULL, 'lease expired after max attempts',
                (d.t).errors || batonq._attempt_error((d.t).attempts, (d.t).fencing_token,
                                                      '"lease expired after max attempts"',
                                                      (d.t).worker, (d.t).claim_key, (d.t).claimed_at))).*
          FROM dead d
        RETURNING id, join_task_id
    )
    SELECT array_agg(a.id) FILTER (WHERE a.join_task_id IS NOT NULL) INTO v_joined FROM archived a;
    IF v_joined IS NOT NULL THEN
        PERFORM batonq._on_dead(p_queue, v_joined);
    END IF;
    RETURN cardinality(v_ids);
END $$;

-- The lock that a limited queue's claims (and a heartbeat taking up a lapsed
-- lease) queue on, held to the end of the transaction: what its holder
-- counts stays true until it has leased. Count in statements after taking
-- it, so they see what the lock's last holder committed.
CREATE OR REPLACE FUNCTION batonq._limits_lock(p_queue text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtext('batonq.limits'), hashtext(p_queue));
$$;

-- Whether one more task of p_group may be leased in p_queue: a heartbeat
-- that takes up a lease which ran out asks this (a claim counts for itself).
CREATE OR REPLACE FUNCTION batonq._room_for(p_queue text, p_group text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_queue batonq.queues;
BEGIN
    SELECT * INTO v_queue FROM batonq.queues WHERE name = p_queue;
    IF v_queue.max_leased IS NULL AND v_queue.group_max_leased IS NULL THEN
        RETURN true;
    END IF;
    PERFORM batonq._limits_lock(p_queue);
    PERFORM batonq._fold_group_leases(p_queue);
    RETURN (v_queue.max_leased IS NULL
            OR (SELECT count(*) FROM batonq.tasks
                 WHERE queue = p_queue AND state = 'leased') < v_queue.max_leased)
       AND (v_queue.group_max_leased IS NULL OR p_group IS NULL
            OR coalesce((SELECT g.leased FROM batonq.group_leases g
                          WHERE g.queue = p_queue AND g.group_key = p_group), 0)
               < v_queue.group_max_leased);
END $$;

-- A lease of p_queue ended (fail, cancel, expiry; complete looks with its
-- other settings): under a concurrency limit that frees room, so claimers
-- waiting on a full queue are woken (release and a retry due now wake
-- every queue's anyway).
CREATE OR REPLACE FUNCTION batonq._lease_ended(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM batonq.queues
                WHERE name = p_queue AND (max_leased IS NOT NULL OR group_max_leased IS NOT NULL)) THEN
        PERFORM batonq._wake(p_queue);
    END IF;
END $$;

-- The tokens a bucket holds at p_now that held p_tokens at p_at: it gains
-- p_limit per p_period_s, up to p_limit.
CREATE OR REPLACE FUNCTION batonq._bucket_tokens(
    p_tokens double precision, p_at timestamptz, p_now timestamptz,
    p_limit integer, p_period_s double precision
) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN least(p_limit, p_tokens + greatest(extract(epoch FROM p_now - p_at), 0) * p_limit / p_period_s);

-- Keeps batonq.group_leases (migrations/0009): a grouped task that becomes
-- leased or stops being leased (claim, heartbeat taking up a lapsed lease,
-- complete, fail, release, expiry, cancel, whatever the path) adds a delta
-- row. Row triggers whose WHEN skips every other change, so tasks without a
-- group, and heartbeats, pay nothing.
CREATE OR REPLACE FUNCTION batonq._count_group_lease() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state = 'leased' AND OLD.group_key IS NOT NULL THEN
        INSERT INTO batonq.group_lease_deltas (queue, group_key, n) VALUES (OLD.queue, OLD.group_key, -1);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.state = 'leased' AND NEW.group_key IS NOT NULL THEN
        INSERT INTO batonq.group_lease_deltas (queue, group_key, n) VALUES (NEW.queue, NEW.group_key, 1);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER tasks_group_lease_insert AFTER INSERT ON batonq.tasks
    FOR EACH ROW WHEN (NEW.state = 'leased' AND NEW.group_key IS NOT NULL)
    EXECUTE FUNCTION batonq._count_group_lease();

CREATE OR REPLACE TRIGGER tasks_group_lease_update AFTER UPDATE ON batonq.tasks
    FOR EACH ROW WHEN ((OLD.state = 'leased' AND OLD.group_key IS NOT NULL
                        OR NEW.state = 'leased' AND NEW.group_key IS NOT NULL)
                       AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.group_key IS DISTINCT FROM NEW.group_key
                            OR OLD.queue IS DISTINCT FROM NEW.queue))
    EXECUTE FUNCTION batonq._count_group_lease();

CREATE OR REPLACE TRIGGER tasks_group_lease_delete AFTER DELETE ON batonq.tasks
    FOR EACH ROW WHEN (OLD.state = 'leased' AND OLD.group_key IS NOT NULL)
    EXECUTE FUNCTION batonq._count_group_lease();

-- Fold p_queue's delta rows into batonq.group_leases: called holding the
-- queue's limits lock, so the counts are exact for its holder (every lease
-- taken or ended before is committed and its delta visible). Reads the
-- deltas since the last fold, about the leases taken and ended since.
-- A group a lease ended in gets back its best set-aside (group_full) tasks,
-- as many as it has room for: no better task of it is left out of the claim
-- index, so a claim still takes each group's tasks in claim order.
CREATE OR REPLACE FUNCTION batonq._fold_group_leases(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_emptied text[];
    v_freed   text[];
BEGIN
    WITH gone AS (
        DELETE FROM batonq.group_lease_deltas d WHERE d.queue = p_queue RETURNING d.group_key, d.n
    ), sums AS (
        SELECT gone.group_key, sum(gone.n) AS n, bool_or(gone.n < 0) AS ended
          FROM gone GROUP BY gone.group_key
    ), folded AS (
        -- In group order, as every fold: two folds wait on each other in
        -- the same order.
        INSERT INTO batonq.group_leases AS g (queue, group_key, leased)
        SELECT p_queue, sums.group_key, sums.n FROM sums ORDER BY sums.group_key
        ON CONFLICT (queue, group_key) DO UPDATE SET leased = g.leased + excluded.leased
        RETURNING g.group_key, g.leased
    )
    SELECT (SELECT array_agg(f.group_key) FROM folded f WHERE f.leased = 0),
           (SELECT array_agg(s.group_key) FROM sums s WHERE s.ended)
      INTO v_emptied, v_freed;
    IF v_emptied IS NOT NULL THEN
        DELETE FROM batonq.group_leases g
         WHERE g.queue = p_queue AND g.group_key = ANY (v_emptied) AND g.leased = 0;
    END IF;
    IF v_freed IS NOT NULL THEN
        -- By the primary key: a t.group_full here would let the planner
        -- read every set-aside task of the queue by its index instead.
        UPDATE batonq.tasks t SET group_full = false
         WHERE t.queue = p_queue AND t.id = ANY (ARRAY(
            SELECT b.id
              FROM unnest(v_freed) AS f(group_key),
                   LATERAL (SELECT p.id FROM batonq.tasks p
                             WHERE p.queue = p_queue AND p.group_key = f.group_key AND p.group_full
                             ORDER BY p.priority DESC, p.run_at, p.id
                             LIMIT greatest((SELECT q.group_max_leased FROM batonq.queues q WHERE q.name = p_queue)
                                            - coalesce((SELECT g.leased FROM batonq.group_leases g
                                                         WHERE g.queue = p_queue AND g.group_key = f.group_key), 0),
                                            0)) b));
    END IF;
END $$;

-- What clears group_full: any change of the task's state (held, leased
-- by a heartbeat taking up its lapsed lease, ...). Only the fold above and
-- a change of group_max_leased clear it on a task still pending.
CREATE OR REPLACE FUNCTION batonq._group_full_cleared() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.group_full := false;
    RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER tasks_group_full_cleared BEFORE UPDATE ON batonq.tasks
    FOR EACH ROW WHEN (OLD.group_full AND NEW.group_full AND NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION batonq._group_full_cleared();

-- The ids a group-limited claim takes, up to p_n: in claim order, skipping
-- the tasks of groups that are full (group_max_leased: with their leases
-- and the tasks taken before in this claim) or out of tokens
-- (group_rate_limit: a token per task taken), so one busy group does not
-- hold the others back. Tasks without a group count against the queue's
-- limits only. The caller holds the queue's limits lock (and takes the
-- tokens once it has leased). The walk reads the claim index in order; each
-- grouped task's lease count and rate bucket are read by key (scalar
-- subqueries: a join could read every group's row). It stops once it has
-- p_n (a cursor fetches as it goes). The tasks it read past because their
-- group was full before this claim are set aside (group_full): out of the
-- claim index until a lease of their group ends (_fold_group_leases), so
-- each is read past once, however many claims come while its group is full.
-- (Not the tasks of a group this claim fills: a task it picked may turn out
-- held or cancelled, and no lease would end to give them back.)
CREATE OR REPLACE FUNCTION batonq._pick_in_groups(p_queue batonq.queues, p_n integer) RETURNS bigint[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan
SET cursor_tuple_fraction = 0.001 AS $$
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_took   jsonb := '{}';     -- how many of each group met this claim took
    v_taken  integer;
    v_ids    bigint[] := '{}';
    v_full   bigint[] := '{}';
    -- Read under the lock: a change of the limit gives every set-aside task
    -- back under the same lock, so none is set aside by the old one after.
    v_max    integer := (SELECT q.group_max_leased FROM batonq.queues q WHERE q.name = p_queue.name);
    v_task   record;
    -- A declared cursor is planned to fetch a few rows first, and the
    -- fraction makes that few: planned for all of them, the walk would sort
    -- the queue's backlog instead of reading the claim index in order.
    v_walk   CURSOR FOR
        SELECT t.id, t.group_key, r.leased, r.spent
          FROM batonq.tasks t
         CROSS JOIN LATERAL (
            SELECT CASE WHEN t.group_key IS NOT NULL AND v_max IS NOT NULL THEN
                        coalesce((SELECT g.leased FROM batonq.group_leases g
                                   WHERE g.queue = p_queue.name AND g.group_key = t.group_key), 0)
                   END AS leased,
                   -- The bucket's tokens taken (a bucket not there is full).
                   CASE WHEN t.group_key IS NOT NULL AND p_queue.group_rate_limit IS NOT NULL THEN
                        coalesce((SELECT ceil(greatest(extract(epoch FROM b.full_at - v_now), 0)
                                              * p_queue.group_rate_limit / p_queue.rate_period_s)::integer
                                    FROM batonq.group_rate_buckets b
                                   WHERE b.queue = p_queue.name AND b.group_key = t.group_key), 0)
                   END AS spent
            OFFSET 0) r
         WHERE t.queue = p_queue.name AND t.state = 'pending' AND NOT t.group_full AND t.run_at <= now()
           AND (r.spent IS NULL OR r.spent < p_queue.group_rate_limit)
         ORDER BY t.priority DESC, t.run_at, t.id;
BEGIN
    PERFORM batonq._fold_group_leases(p_queue.name);
    FOR v_task IN v_walk LOOP
        IF v_task.group_key IS NOT NULL THEN
            IF v_task.leased >= v_max THEN  -- full before this claim (NULL: no limit)
                v_full := v_full || v_task.id;
                CONTINUE;
            END IF;
            v_taken := coalesce((v_took ->> v_task.group_key)::integer, 0);
            -- Room under group_max_leased and the bucket's whole tokens (a
            -- comparison with a limit not set is NULL: no skip).
            CONTINUE WHEN v_task.leased + v_taken >= v_max
                       OR v_task.spent + v_taken >= p_queue.group_rate_limit;
            v_took := jsonb_set(v_took, ARRAY[v_task.group_key], to_jsonb(v_taken + 1));
        END IF;
        v_ids := v_ids || v_task.id;
        EXIT WHEN cardinality(v_ids) >= p_n;
    END LOOP;
    IF cardinality(v_full) > 0 THEN
        UPDATE batonq.tasks t SET group_full = true
         WHERE t.queue = p_queue.name AND t.id = ANY (v_full) AND t.state = 'pending';
    END IF;
    RETURN v_ids;
END $$;

-- Claim up to p_max_tasks claimable tasks of one queue: highest priority
-- first, then oldest run_at. Each claimed task gets a fresh fencing token and
-- lease secret and counts an attempt. A lease's "row" is the task's input
-- (its payload). p_key_id records the API key that asked (the service's),
-- so that key may later name the lease by task and fencing token alone.
--
-- A queue with limits (max_leased, group_max_leased, rate_limit,
-- group_rate_limit) claims one claimer at a time: its claims queue on the
-- queue's limits lock, count the leases held, take what room is left
-- (skipping full groups and those with an empty bucket) and as many tokens
-- of the rate buckets, so no claim ever exceeds a limit however
-- many claimers there are. Queues without limits take no lock.
--
-- Written for generic plans (PL/pgSQL caches them): the queue is named on
-- every reference to the partitioned table, so the planner prunes to one
-- partition, and the ids are picked in a MATERIALIZED CTE and matched with
-- = ANY(ARRAY(...)), which never over-fetches (a semi-join on a SKIP LOCKED
-- subquery may be re-evaluated and claim more than asked) and never turns
-- into a hash join over the whole table; the ids are looked up by the
-- primary key alone (the state test above expire_leases says why), so a
-- claim reads its batch whether or not the table was ever analyzed.
CREATE OR REPLACE FUNCTION batonq.claim(
    p_queue     text,
    p_worker    text DEFAULT NULL,
    p_max_tasks integer DEFAULT 1,
    p_lease_s   integer DEFAULT NULL,
    p_key_id    bigint DEFAULT NULL
) RETURNS SETOF batonq.lease
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_queue   batonq.queues;
    v_lease_s integer;
    v_take    integer := p_max_tasks;  -- picked in claim order
    v_ids     bigint[] := '{}';        -- picked by the group walk
    v_now     timestamptz;
    v_tokens  double precision;
    v_count   integer;
    v_locked  boolean := false;
BEGIN
    -- Arguments first, so a bad call fails the same on a queue that does not
    -- exist yet.
    IF p_lease_s < 1 OR p_lease_s > 3600 THEN
        PERFORM batonq._invalid_argument('lease_s must be between 1 and 3600');
    END IF;
    IF p_max_tasks IS NULL OR p_max_tasks < 1 OR p_max_tasks > 10000 THEN
        PERFORM batonq._invalid_argument('max_tasks must be between 1 and 10000');
    END IF;
    SELECT * INTO v_queue FROM batonq.queues WHERE name = p_queue;
    IF NOT FOUND THEN
        PERFORM batonq._check_queue_name(p_queue);
        RETURN;
    END IF;
    IF v_queue.paused THEN
        RETURN;
    END IF;
    v_lease_s := coalesce(p_lease_s, v_queue.lease_s);
    -- Recovery needs no background process: the claimer of a queue takes its
    -- expired leases as the next holder. Looked for here first: calling
    -- expire_leases costs a function call and its settings even when it
    -- finds nothing (about a sixth of a one-task claim's server time).
    IF EXISTS (SELECT FROM batonq.tasks
                WHERE queue = p_queue AND state = 'leased' AND lease_expires_at < now()) THEN
        PERFORM batonq.expire_leases(p_queue);
    END IF;
    IF v_queue.max_leased IS NOT NULL OR v_queue.group_max_leased IS NOT NULL
       OR v_queue.rate_limit IS NOT NULL OR v_queue.group_rate_limit IS NOT NULL THEN
        -- Looked at twice: first without the lock, so that the claimers a
        -- lease's end wakes on a full queue (or an empty bucket) do not
        -- queue on it only to find no room; then holding it. Room seen
        -- without the lock may be gone, never the other way round: the lock's
        -- holders only take room (the others give it back, and wake).
        LOOP
            v_take := p_max_tasks;
            IF v_queue.max_leased IS NOT NULL THEN
                v_take := least(v_take, v_queue.max_leased - (
                    SELECT count(*) FROM batonq.tasks WHERE queue = p_queue AND state = 'leased'));
            END IF;
            IF v_queue.rate_limit IS NOT NULL THEN
                -- The bucket holds up to rate_limit tokens and gains
                -- rate_limit per rate_period_s; the clock, not now(): this
                -- transaction may have begun before the lock's last holder
                -- refilled it.
                v_now := clock_timestamp();
                v_tokens := coalesce(
                    (SELECT batonq._bucket_tokens(b.tokens, b.at, v_now, v_queue.rate_limit,
                                                  v_queue.rate_period_s)
                       FROM batonq.rate_buckets b WHERE b.queue = p_queue),
                    v_queue.rate_limit);
                v_take := least(v_take, floor(v_tokens)::integer);
            END IF;
            IF v_take <= 0 THEN
                RETURN;
            END IF;
            EXIT WHEN v_locked;
            PERFORM batonq._limits_lock(p_queue);
            v_locked := true;
        END LOOP;
        IF v_queue.group_max_leased IS NOT NULL OR v_queue.group_rate_limit IS NOT NULL THEN
            v_ids := batonq._pick_in_groups(v_queue, v_take);
            v_take := 0;
        END IF;
    END IF;
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT id FROM batonq.tasks
         WHERE queue = p_queue AND state = 'pending' AND NOT group_full AND run_at <= now()
         ORDER BY priority DESC, run_at, id
         LIMIT v_take
           FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE batonq.tasks t SET
            state = 'leased',
            attempts = t.attempts + 1,
            -- Above the task's last token even if the sequence is behind
            -- it (restored, or one of a node's ranges under Citus:
            -- docs/scaling.md): a stale holder's token is always smaller.
            fencing_token = greatest(nextval('batonq.fencing_seq'), t.fencing_token + 1),
            lease_secret = gen_random_uuid(),
            lease_s = v_lease_s,
            lease_expires_at = now() + make_interval(secs => v_lease_s),
            claimed_at = now(),
            worker = p_worker,
            claim_key = p_key_id,
            stage = NULL
         WHERE t.queue = p_queue AND t.id = ANY (ARRAY(SELECT id FROM picked) || v_ids)
           AND t.state NOT IN ('waiting', 'held', 'leased')
        RETURNING t.*
    )
    SELECT c.id, c.queue, c.fencing_token,
           batonq._lease_token(c.queue, c.id, c.fencing_token, c.lease_secret),
           c.lease_expires_at, v_lease_s::double precision,
           c.attempts, c.max_attempts, c.priority, c.payload, c.idempotency_key,
           c.parent_id, c.root_id, c.created_at, c.run_at, c.group_key, c.trace_context
      FROM claimed c
     ORDER BY c.priority DESC, c.run_at, c.id;
    IF v_tokens IS NOT NULL THEN
        GET DIAGNOSTICS v_count = ROW_COUNT;
        INSERT INTO batonq.rate_buckets AS b (queue, tokens, at)
        VALUES (p_queue, v_tokens - v_count, v_now)
        ON CONFLICT (queue) DO UPDATE SET tokens = excluded.tokens, at = excluded.at;
    END IF;
    -- Each group claimed from gives a token per task: its bucket is full
    -- again rate_period_s / group_rate_limit later per token (from now, if
    -- it was full). The walk's picks that were leased are this claim's:
    -- only the lock's holder leases them.
    IF v_queue.group_rate_limit IS NOT NULL AND cardinality(v_ids) > 0 THEN
        v_now := clock_timestamp();
        INSERT INTO batonq.group_rate_buckets AS b (queue, group_key, full_at)
        SELECT p_queue, t.group_key,
               v_now + make_interval(secs => count(*) * v_queue.rate_period_s / v_queue.group_rate_limit)
          FROM batonq.tasks t
         WHERE t.queue = p_queue AND t.id = ANY (v_ids) AND t.state NOT IN ('waiting', 'held', 'pending')
           AND t.group_key IS NOT NULL
         GROUP BY t.group_key
        ON CONFLICT (queue, group_key) DO UPDATE SET
            full_at = excluded.full_at + greatest(b.full_at - v_now, interval '0');
    END IF;
END $$;

-- Seconds until a claim of p_queue may find a token: the queue's rate
-- bucket's wait when it is empty, else the soonest token of the group
-- buckets that are empty while their group has tasks due (the claim skipped
-- those); 0 when nothing waits on a token or the queue has no rate limits.
-- A claimer that found nothing sleeps this long (at most) instead of
-- polling an empty bucket. The group look reads the queue's empty buckets
-- by index and, for each, the claim index until a due task of its group.
-- A bucket whose token came due less than 0.2 s ago still counts as empty,
-- with a wait of 1 ms: the claim that found it empty ran a moment before
-- this look (a round trip earlier, through a pooler), and a 0 would send
-- its claimer to sleep for its whole idle wait with a token ready.
CREATE OR REPLACE FUNCTION batonq.rate_wait_s(p_queue text) RETURNS double precision
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT coalesce((SELECT CASE WHEN w.s > -0.2 THEN greatest(w.s, 0.001) ELSE 0 END
      FROM batonq.queues q,
           LATERAL (SELECT greatest(
               -- (The queue's bucket short of a token when last taken from:
               -- its next token's time, uncapped, so a token long due is
               -- far below -0.2 s.)
               coalesce((SELECT (1 - b.tokens) * q.rate_period_s / q.rate_limit
                                - extract(epoch FROM clock_timestamp() - b.at)
                           FROM batonq.rate_buckets b
                          WHERE b.queue = q.name AND q.rate_limit IS NOT NULL AND b.tokens < 1), -1),
               -- A group's bucket holds a token again once it is full within
               -- group_rate_limit - 1 tokens' time.
               coalesce((SELECT extract(epoch FROM min(g.full_at) - clock_timestamp())
                                - (q.group_rate_limit - 1) * q.rate_period_s / q.group_rate_limit
                           FROM batonq.group_rate_buckets g
                          WHERE g.queue = q.name AND q.group_rate_limit IS NOT NULL
                            AND g.full_at > clock_timestamp() + make_interval(
                                    secs => (q.group_rate_limit - 1) * q.rate_period_s / q.group_rate_limit - 0.2)
                            AND EXISTS (SELECT FROM batonq.tasks t
                                         WHERE t.queue = q.name AND t.state = 'pending' AND NOT t.group_full
                                           AND t.run_at <= now() AND t.group_key = g.group_key)), -1)) AS s) w
     WHERE q.name = p_queue), 0)::double precision;
END;

-- Expire the leases of every queue that has expired ones: for queues nobody
-- is claiming from. Returns how many tasks it touched. Also folds the group
-- lease counts of every queue (under its limits lock), so the deltas of
-- queues that no group-limited claim folds do not pile up.
CREATE OR REPLACE FUNCTION batonq.sweep() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_queue text;
    v_total integer := 0;
BEGIN
    FOR v_queue IN
        SELECT DISTINCT queue FROM batonq.tasks WHERE state = 'leased' AND lease_expires_at < now()
    LOOP
        v_total := v_total + batonq.expire_leases(v_queue);
    END LOOP;
    FOR v_queue IN SELECT DISTINCT d.queue FROM batonq.group_lease_deltas d LOOP
        PERFORM batonq._limits_lock(v_queue);
        PERFORM batonq._fold_group_leases(v_queue);
    END LOOP;
    RETURN v_total;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    batonq.claim(text, text, integer, integer, bigint),
    batonq.expire_leases(text, integer),
    batonq.sweep()
TO batonq_worker;
GRANT EXECUTE ON FUNCTION batonq.rate_wait_s(text) TO batonq_reader;

-- engine/submit.sql
-- batonq engine: writes about a leased task (complete, fail, heartbeat,
-- release), each checked against the lease token.
--
-- A write is accepted while its fencing token is the task's newest and the
-- task is unfinished: leased, or pending after its lease ran out with nobody
-- claiming it since (nobody else holds it). The first accepted complete or
-- fail per (task, token) is the outcome; a repeat of the same write kind
-- under the same lease token returns it with outcome 'replayed' and changes
-- nothing (an accepted complete is found in the archive, an accepted fail in
-- the submit ledger, each with its lease secret). A complete after a fail, a
-- fail after a complete, is no replay. Anything else is refused with outcome
-- 'lease_lost' (or 'finished', when the task is done, dead or cancelled) and
-- the task's current state and token, and set aside in the submit ledger.

-- The slow path of every write that did not match a live lease: replay,
-- refusal, or an error for an unknown task or a forged token.
CREATE OR REPLACE FUNCTION batonq._refuse(p_ref batonq.lease_ref, p_kind text, p_body jsonb)
RETURNS batonq.submit_reply
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_first  text;
    v_state  text;
    v_token  bigint;
    v_secret uuid;
    v_reply  batonq.submit_reply;
BEGIN
    -- The first outcome of this write kind under this lease token: an
    -- accepted complete is the task's archive row (only a complete makes a
    -- task done, and the row keeps its token and secret); an accepted fail
    -- is in the ledger.
    IF p_kind = 'complete' THEN
        v_first := (SELECT a.state FROM batonq.archive a
                     WHERE a.id = p_ref.task_id AND a.queue = p_ref.queue
                       AND a.fencing_token = p_ref.fencing_token AND a.state = 'done'
                       AND a.lease_secret = p_ref.secret
                     LIMIT 1);
    ELSIF p_kind = 'fail' THEN
        v_first := (SELECT s.state_after FROM batonq.submits s
                     WHERE s.task_id = p_ref.task_id AND s.fencing_token = p_ref.fencing_token
                       AND s.outcome = 'accepted' AND s.kind = 'fail' AND s.lease_secret = p_ref.secret
                     LIMIT 1);
    END IF;
    IF p_kind IN ('complete', 'fail') THEN
        IF v_first IS NOT NULL THEN
            INSERT INTO batonq.submits (task_id, queue, fencing_token, kind, outcome, state_after, body)
            VALUES (p_ref.task_id, p_ref.queue, p_ref.fencing_token, p_kind, 'replayed', v_first, p_body);
            RETURN ROW(p_ref.task_id, p_ref.queue, 'replayed', v_first,
                       p_ref.fencing_token, p_ref.fencing_token, NULL, NULL)::batonq.submit_reply;
        END IF;
    END IF;
    SELECT state, fencing_token, lease_secret INTO v_state, v_token, v_secret
      FROM batonq.tasks WHERE queue = p_ref.queue AND id = p_ref.task_id;
    IF NOT FOUND THEN
        SELECT state, fencing_token, lease_secret INTO v_state, v_token, v_secret
          FROM batonq.archive WHERE id = p_ref.task_id AND queue = p_ref.queue LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % not found in queue %', p_ref.task_id, p_ref.queue
                USING ERRCODE = 'BQ002', DETAIL = jsonb_build_object('task_id', p_ref.task_id)::text;
        END IF;
    END IF;
    -- The right fencing token with another secret is a forged or garbled
    -- token, hot or finished.
    IF v_token = p_ref.fencing_token AND v_secret IS DISTINCT FROM p_ref.secret
       AND v_secret IS NOT NULL THEN
        RAISE EXCEPTION 'wrong lease token for task %', p_ref.task_id
            USING ERRCODE = 'BQ005', DETAIL = jsonb_build_object('task_id', p_ref.task_id)::text;
    END IF;
    INSERT INTO batonq.submits (task_id, queue, fencing_token, kind, outcome, state_after, body)
    VALUES (p_ref.task_id, p_ref.queue, p_ref.fencing_token, p_kind, 'set_aside', v_state, p_body);
    RETURN ROW(p_ref.task_id, p_ref.queue,
               CASE WHEN v_state IN ('done', 'dead', 'cancelled') THEN 'finished' ELSE 'lease_lost' END,
               v_state, p_ref.fencing_token, v_token, NULL, NULL)::batonq.submit_reply;
END $$;

-- The lease token of a lease named by its task and fencing token, for the
-- API key p_key_id: the real token when that key claimed the lease and it is
-- still the task's; otherwise a token whose secret matches no lease, which
-- the writes refuse exactly as they refuse a forged one (wrong lease token,
-- lease_lost or finished, set aside; a replay of an accepted complete).
-- Not granted to the worker role: a key id is no secret, so only the
-- service, which checked the key itself, may vouch for one.
CREATE OR REPLACE FUNCTION batonq.lease_token_for_key(p_task_id bigint, p_fencing_token bigint, p_key_id bigint)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_queue  text;
    v_token  bigint;
    v_key    bigint;
    v_secret uuid;
BEGIN
    SELECT queue, fencing_token, claim_key, lease_secret INTO v_queue, v_token, v_key, v_secret
      FROM batonq.tasks WHERE id = p_task_id;
    IF NOT FOUND THEN
        -- Finished: the archive keeps the last lease's secret and key, so
        -- that key's repeated complete or fail is still a replay.
        SELECT queue, fencing_token, claim_key, lease_secret INTO v_queue, v_token, v_key, v_secret
          FROM batonq.archive WHERE id = p_task_id LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task t_% not found', p_task_id
                USING ERRCODE = 'BQ002', DETAIL = jsonb_build_object('task_id', p_task_id)::text;
        END IF;
    ELSIF v_token = p_fencing_token AND v_key = p_key_id AND v_secret IS NULL THEN
        -- Failed and waiting for its retry: the accepted fail kept the
        -- secret in the ledger, for the same key's repeated fail.
        v_secret := (SELECT s.lease_secret FROM batonq.submits s
                      WHERE s.task_id = p_task_id AND s.fencing_token = p_fencing_token
                        AND s.outcome = 'accepted' AND s.kind = 'fail'
                      LIMIT 1);
    END IF;
    IF v_token = p_fencing_token AND v_key = p_key_id AND v_secret IS NOT NULL THEN
        RETURN batonq._lease_token(v_queue, p_task_id, p_fencing_token, v_secret);
    END IF;
    RETURN batonq._lease_token(v_queue, p_task_id, p_fencing_token, '00000000-0000-0000-0000-000000000000');
END $$;

-- What a complete needs of its queue's settings, in one look: the limit of
-- a result's size, and whether a concurrency limit waits for the lease to
-- end (batonq._lease_ended). PL/pgSQL, not SQL: its plan is cached (a SQL
-- function with a subquery is planned at every call).
CREATE OR REPLACE FUNCTION batonq._submit_settings(p_queue text, OUT max_body_bytes integer,
                                                   OUT lease_limited boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT q.max_body_bytes, q.max_leased IS NOT NULL OR q.group_max_leased IS NOT NULL
      INTO max_body_bytes, lease_limited
      FROM batonq.queues q WHERE q.name = p_queue;
    max_body_bytes := coalesce(max_body_bytes, 131072);
    lease_limited := coalesce(lease_limited, false);
END $$;

-- Complete a leased task of p_queue with its result: it moves to the archive
-- as done.
CREATE OR REPLACE FUNCTION batonq.complete_in(p_queue text, p_lease_token text, p_result jsonb DEFAULT NULL,
                                              p_trace_context jsonb DEFAULT NULL)
RETURNS batonq.submit_reply
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ref      batonq.lease_ref := batonq._parse_token_in(p_queue, p_lease_token);
    v_settings record := batonq._submit_settings(v_ref.queue);
    v_id       bigint;
    v_joined   boolean;
BEGIN
    PERFORM batonq._check_json('result', p_result, v_settings.max_body_bytes);
    WITH moved AS (
        DELETE FROM batonq.tasks t
         WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id
           AND t.fencing_token = v_ref.fencing_token AND t.lease_secret = v_ref.secret
           AND t.state IN ('leased', 'pending')
        RETURNING t
    ), archived AS (
        INSERT INTO batonq.archive
        SELECT (batonq._archive_row(m.t, 'done', p_result, p_trace_context => p_trace_context)).* FROM moved m
    )
    SELECT (m.t).id, (m.t).join_task_id IS NOT NULL INTO v_id, v_joined FROM moved m;
    IF v_id IS NULL THEN
        RETURN batonq._refuse(v_ref, 'complete', p_result);
    END IF;
    IF v_settings.lease_limited THEN
        PERFORM batonq._wake(v_ref.queue);  -- room under the limit: see _lease_ended
    END IF;
    -- The batons leave in the transaction that accepts the completion.
    IF v_joined OR EXISTS (SELECT FROM batonq.edges e WHERE e.from_queue = v_ref.queue) THEN
        PERFORM batonq._hand_off(v_ref.queue, ARRAY[v_id]);
    END IF;
    RETURN ROW(v_ref.task_id, v_ref.queue, 'accepted', 'done', v_ref.fencing_token,
               v_ref.fencing_token, NULL, NULL)::batonq.submit_reply;
END $$;

-- Complete many leased tasks of p_queue in one call: one reply per token, in
-- order; an unknown task or a forged token is one item's outcome (not_found,
-- invalid_token), not an error of the call.
-- Tokens are parsed once, into one array; the live leases move in one set of
-- statements, and only the rest (replays, refusals) go one by one. Unlike
-- the other functions it may plan for its arguments (plan_cache_mode auto):
-- a batch pays for one plan, and a generic DELETE on the partitioned table
-- opens all 16 partitions.
CREATE OR REPLACE FUNCTION batonq.complete_many_in(p_queue text, p_lease_tokens text[], p_results jsonb[] DEFAULT NULL,
                                                   p_trace_contexts jsonb[] DEFAULT NULL)
RETURNS TABLE (ord integer, task_id bigint, queue text, outcome text, state text,
               fencing_token bigint, current_fencing_token bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = auto SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_refs      batonq.lease_ref[] := ARRAY(
        SELECT batonq._parse_token_in(p_queue, u.tok)
          FROM unnest(p_lease_tokens) WITH ORDINALITY AS u(tok, ord)
         ORDER BY u.ord);
    v_n         integer := cardinality(v_refs);
    v_done      boolean[] := array_fill(false, ARRAY[v_n]);
    v_settings  record := batonq._submit_settings(p_queue);
    v_limit     integer := v_settings.max_body_bytes;
    v_bad       integer;
    v_moved     integer[];
    v_moved_ids bigint[];
    v_joined    boolean;
    v_replies   batonq.submit_reply[] := '{}';
    v_ord       integer;
BEGIN
    IF cardinality(p_results) > v_n OR cardinality(p_trace_contexts) > v_n THEN
        PERFORM batonq._invalid_argument('results and trace_contexts may not be longer than lease_tokens');
    END IF;
    SELECT u.ord INTO v_bad
      FROM unnest(p_results) WITH ORDINALITY AS u(res, ord),
           LATERAL (SELECT u.res::text AS txt OFFSET 0) x  -- as in enqueue_many
     WHERE octet_length(x.txt) >= least(v_limit + 1, 2 * batonq._max_json_depth() + 2)
       AND NOT batonq._json_fits(u.res, x.txt, v_limit)
     LIMIT 1;
    IF v_bad IS NOT NULL THEN
        PERFORM batonq._check_json(format('result %s', v_bad), p_results[v_bad], v_limit);
    END IF;
    WITH input AS MATERIALIZED (
        SELECT u.ord, u.id, u.fence, u.secret, u.res, u.trace
          FROM unnest(v_refs, p_results, p_trace_contexts) WITH ORDINALITY AS u(q, id, fence, secret, res, trace, ord)
    ), moved AS (
        -- Each input row probes the primary key: (id, queue) names one
        -- row. (An added id = ANY (all ids) rode along into every probe,
        -- and the index scan sorted the whole array again for each row.)
        DELETE FROM batonq.tasks t
         USING input i
         WHERE t.queue = p_queue AND t.id = i.id AND t.fencing_token = i.fence
           AND t.lease_secret = i.secret AND t.state IN ('leased', 'pending')
        RETURNING t, i.res, i.trace, i.ord
    ), archived AS (
        INSERT INTO batonq.archive
        SELECT (batonq._archive_row(m.t, 'done', m.res, p_trace_context => m.trace)).* FROM moved m
    )
    SELECT array_agg(m.ord::integer), array_agg((m.t).id), bool_or((m.t).join_task_id IS NOT NULL)
      INTO v_moved, v_moved_ids, v_joined
      FROM moved m;
    IF v_moved IS NOT NULL THEN
        FOREACH v_ord IN ARRAY v_moved LOOP
            v_done[v_ord] := true;
        END LOOP;
        IF v_settings.lease_limited THEN
            PERFORM batonq._wake(p_queue);  -- room under the limit: see _lease_ended
        END IF;
        -- The batons leave in the transaction that accepts the completions.
        IF v_joined OR EXISTS (SELECT FROM batonq.edges e WHERE e.from_queue = p_queue) THEN
            PERFORM batonq._hand_off(p_queue, v_moved_ids);
        END IF;
    END IF;

    -- The rest: replays and refusals, each with its own answer.
    IF coalesce(cardinality(v_moved), 0) < v_n THEN
        FOR i IN 1 .. v_n LOOP
            CONTINUE WHEN v_done[i];
            -- An unknown task or a forged token is answered for its item
            -- alone: the other items stand.
            BEGIN
                v_replies[i] := batonq._refuse(v_refs[i], 'complete', p_results[i]);
            EXCEPTION WHEN SQLSTATE 'BQ002' OR SQLSTATE 'BQ005' THEN
                v_replies[i] := ROW((v_refs[i]).task_id, (v_refs[i]).queue,
                                    CASE SQLSTATE WHEN 'BQ002' THEN 'not_found' ELSE 'invalid_token' END,
                                    NULL, (v_refs[i]).fencing_token, NULL, NULL, NULL)::batonq.submit_reply;
            END;
        END LOOP;
    END IF;

    RETURN QUERY
    SELECT i, (v_refs[i]).task_id, (v_refs[i]).queue,
           CASE WHEN v_done[i] THEN 'accepted' ELSE (v_replies[i]).outcome END,
           CASE WHEN v_done[i] THEN 'done' ELSE (v_replies[i]).state END,
           (v_refs[i]).fencing_token,
           CASE WHEN v_done[i] THEN (v_refs[i]).fencing_token ELSE (v_replies[i]).current_fencing_token END
      FROM generate_series(1, v_n) AS i;
END $$;

-- Fail a leased task. requeue = false, or no attempts left: dead, in the
-- archive. Otherwise pending again after retry_delay_s, or after the queue's
-- backoff when none is given; the lease is given up either way. Every
-- attempt's error is kept.
CREATE OR REPLACE FUNCTION batonq.fail_in(
    p_queue         text,
    p_lease_token   text,
    p_error         jsonb DEFAULT NULL,
    p_retry_delay_s double precision DEFAULT NULL,
    p_requeue       boolean DEFAULT true
) RETURNS batonq.submit_reply
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ref   batonq.lease_ref := batonq._parse_token_in(p_queue, p_lease_token);
    v_queue batonq.queues;
    v_task  batonq.tasks;
    v_state text;
    v_entry jsonb;
    v_delay_s double precision;
BEGIN
    IF p_retry_delay_s < 0 OR p_retry_delay_s > 315360000 THEN
        PERFORM batonq._invalid_argument('retry_delay_s must be between 0 and 315360000 (10 years)');
    END IF;
    SELECT * INTO v_queue FROM batonq.queues WHERE name = v_ref.queue;
    PERFORM batonq._check_json('error', p_error, coalesce(v_queue.max_body_bytes, 131072));
    SELECT * INTO v_task FROM batonq.tasks t
     WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id
       AND t.fencing_token = v_ref.fencing_token AND t.lease_secret = v_ref.secret
       AND t.state IN ('leased', 'pending')
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN batonq._refuse(v_ref, 'fail', p_error);
    END IF;
    v_entry := batonq._attempt_error(v_task.attempts, v_task.fencing_token, p_error,
                                     v_task.worker, v_task.claim_key, v_task.claimed_at);
    IF NOT p_requeue OR v_task.attempts >= v_task.max_attempts THEN
        v_state := 'dead';
        DELETE FROM batonq.tasks t WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id;
        INSERT INTO batonq.archive
        SELECT (batonq._archive_row(v_task, 'dead', NULL, batonq._error_text(p_error),
                                    v_task.errors || v_entry)).*;
        IF v_task.join_task_id IS NOT NULL THEN
            PERFORM batonq._on_dead(v_ref.queue, ARRAY[v_task.id]);
        END IF;
    ELSE
        v_state := 'pending';
        v_delay_s := coalesce(p_retry_delay_s, batonq._backoff_s(v_queue, v_task.attempts));
        UPDATE batonq.tasks t SET
            state = 'pending',
            run_at = now() + make_interval(secs => v_delay_s),
            lease_secret = NULL,
            lease_expires_at = NULL,
            last_error = batonq._error_text(p_error),
            errors = t.errors || v_entry
         WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id;
        IF v_delay_s <= 0 THEN
            PERFORM batonq._wake(v_ref.queue);  -- claimable again now
        END IF;
    END IF;
    IF v_task.state = 'leased' AND (v_state = 'dead' OR v_delay_s > 0) THEN
        PERFORM batonq._lease_ended(v_ref.queue);  -- (a retry due now woke them above)
    END IF;
    INSERT INTO batonq.submits (task_id, queue, fencing_token, kind, outcome, state_after, body,
                                lease_secret)
    VALUES (v_ref.task_id, v_ref.queue, v_ref.fencing_token, 'fail', 'accepted', v_state, p_error,
            v_ref.secret);
    RETURN ROW(v_ref.task_id, v_ref.queue, 'accepted', v_state, v_ref.fencing_token,
               v_ref.fencing_token, NULL, NULL)::batonq.submit_reply;
END $$;

-- Extend a lease by p_lease_s (default: the claim's lease length) from now,
-- and optionally set the task's stage text. A lease that ran out with nobody
-- claiming since is taken up again, if the queue's concurrency limits leave
-- room for it (batonq._room_for: checked only then).
CREATE OR REPLACE FUNCTION batonq.heartbeat_in(
    p_queue       text,
    p_lease_token text,
    p_lease_s     integer DEFAULT NULL,
    p_stage       text DEFAULT NULL
) RETURNS batonq.submit_reply
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ref     batonq.lease_ref := batonq._parse_token_in(p_queue, p_lease_token);
    v_expires timestamptz;
BEGIN
    IF p_lease_s < 1 OR p_lease_s > 3600 THEN
        PERFORM batonq._invalid_argument('lease_s must be between 1 and 3600');
    END IF;
    UPDATE batonq.tasks t SET
        state = 'leased',
        lease_s = coalesce(p_lease_s, t.lease_s),
        lease_expires_at = now() + make_interval(secs => coalesce(p_lease_s, t.lease_s)),
        stage = coalesce(p_stage, t.stage)
     WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id
       AND t.fencing_token = v_ref.fencing_token AND t.lease_secret = v_ref.secret
       AND (t.state = 'leased' OR t.state = 'pending' AND batonq._room_for(t.queue, t.group_key))
    RETURNING t.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        RETURN batonq._refuse(v_ref, 'heartbeat', to_jsonb(p_stage));
    END IF;
    RETURN ROW(v_ref.task_id, v_ref.queue, 'accepted', 'leased', v_ref.fencing_token,
               v_ref.fencing_token, v_expires,
               extract(epoch FROM v_expires - now())::double precision)::batonq.submit_reply;
END $$;

-- Give a lease back unfinished (a worker shutting down): the task is
-- claimable at once and the attempt is not counted.
CREATE OR REPLACE FUNCTION batonq.release_lease_in(p_queue text, p_lease_token text) RETURNS batonq.submit_reply
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ref batonq.lease_ref := batonq._parse_token_in(p_queue, p_lease_token);
BEGIN
    UPDATE batonq.tasks t SET
        state = 'pending',
        attempts = greatest(t.attempts - 1, 0),
        lease_secret = NULL,
        lease_expires_at = NULL,
        run_at = least(t.run_at, now())
     WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id
       AND t.fencing_token = v_ref.fencing_token AND t.lease_secret = v_ref.secret
       AND t.state IN ('leased', 'pending');
    IF NOT FOUND THEN
        RETURN batonq._refuse(v_ref, 'release', NULL);
    END IF;
    PERFORM batonq._wake(v_ref.queue);
    RETURN ROW(v_ref.task_id, v_ref.queue, 'accepted', 'pending', v_ref.fencing_token,
               v_ref.fencing_token, NULL, NULL)::batonq.submit_reply;
END $$;

-- The same writes keyed by the lease token alone, for SQL callers: the queue
-- is the token's first part. The clients call the *_in forms, which a
-- sharded deployment can route by their first argument (docs/scaling.md).
CREATE OR REPLACE FUNCTION batonq.complete(p_lease_token text, p_result jsonb DEFAULT NULL)
RETURNS batonq.submit_reply
LANGUAGE sql
RETURN batonq.complete_in(split_part(p_lease_token, '/', 1), p_lease_token, p_result);

CREATE OR REPLACE FUNCTION batonq.fail(
    p_lease_token   text,
    p_error         jsonb DEFAULT NULL,
    p_retry_delay_s double precision DEFAULT NULL,
    p_requeue       boolean DEFAULT true
) RETURNS batonq.submit_reply
LANGUAGE sql
RETURN batonq.fail_in(split_part(p_lease_token, '/', 1), p_lease_token, p_error, p_retry_delay_s, p_requeue);

CREATE OR REPLACE FUNCTION batonq.heartbeat(
    p_lease_token text,
    p_lease_s     integer DEFAULT NULL,
    p_stage       text DEFAULT NULL
) RETURNS batonq.submit_reply
LANGUAGE sql
RETURN batonq.heartbeat_in(split_part(p_lease_token, '/', 1), p_lease_token, p_lease_s, p_stage);

CREATE OR REPLACE FUNCTION batonq.release_lease(p_lease_token text) RETURNS batonq.submit_reply
LANGUAGE sql
RETURN batonq.release_lease_in(split_part(p_lease_token, '/', 1), p_lease_token);

-- Tokens of many queues: complete_many_in once per queue, the replies back
-- in the tokens' order.
CREATE OR REPLACE FUNCTION batonq.complete_many(p_lease_tokens text[], p_results jsonb[] DEFAULT NULL,
                                                p_trace_contexts jsonb[] DEFAULT NULL)
RETURNS TABLE (ord integer, task_id bigint, queue text, outcome text, state text,
               fencing_token bigint, current_fencing_token bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF cardinality(p_results) > cardinality(p_lease_tokens)
       OR cardinality(p_trace_contexts) > cardinality(p_lease_tokens) THEN
        PERFORM batonq._invalid_argument('results and trace_contexts may not be longer than lease_tokens');
    END IF;
    RETURN QUERY
    SELECT g.ords[r.ord], r.task_id, r.queue, r.outcome, r.state, r.fencing_token, r.current_fencing_token
      FROM (SELECT split_part(u.tok, '/', 1) AS q, array_agg(u.tok ORDER BY u.o) AS toks,
                   array_agg(u.res ORDER BY u.o) AS results, array_agg(u.trace ORDER BY u.o) AS traces,
                   array_agg(u.o::integer ORDER BY u.o) AS ords
              FROM unnest(p_lease_tokens, p_results, p_trace_contexts) WITH ORDINALITY AS u(tok, res, trace, o)
             GROUP BY 1) g,
           LATERAL batonq.complete_many_in(g.q, g.toks, g.results, g.traces) r
     ORDER BY 1;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    batonq.heartbeat_in(text, text, integer, text),
    batonq.complete_in(text, text, jsonb, jsonb),
    batonq.complete_many_in(text, text[], jsonb[], jsonb[]),
    batonq.fail_in(text, text, jsonb, double precision, boolean),
    batonq.release_lease_in(text, text),
    batonq.heartbeat(text, integer, text),
    batonq.complete(text, jsonb),
    batonq.complete_many(text[], jsonb[], jsonb[]),
    batonq.fail(text, jsonb, double precision, boolean),
    batonq.release_lease(text)
TO batonq_worker;
GRANT EXECUTE ON FUNCTION batonq.lease_token_for_key(bigint, bigint, bigint) TO batonq_service;

-- engine/operator.sql
-- batonq engine: reads, the finished counts, and operator actions on a task
-- by id.

CREATE OR REPLACE FUNCTION batonq._hot_view(t batonq.tasks) RETURNS batonq.task_view
LANGUAGE sql IMMUTABLE
RETURN ROW(t.id, t.queue, t.state, t.priority, t.run_at, t.created_at, t.payload, t.attempts,
           t.max_attempts, t.idempotency_key, t.parent_id, t.root_id, t.fencing_token,
           t.lease_expires_at, t.claimed_at, t.worker, t.stage, t.last_error, t.errors,
           NULL, NULL, t.group_key)::batonq.task_view;

CREATE OR REPLACE FUNCTION batonq._archive_view(a batonq.archive) RETURNS batonq.task_view
LANGUAGE sql IMMUTABLE
RETURN ROW(a.id, a.queue, a.state, a.priority, a.run_at, a.created_at, a.payload, a.attempts,
           a.max_attempts, a.idempotency_key, a.parent_id, a.root_id, a.fencing_token,
           NULL, a.claimed_at, a.worker, a.stage, a.last_error, a.errors,
           a.result, a.finished_at, a.group_key)::batonq.task_view;

-- One task by id, hot or archived, with its attempt history (errors).
CREATE OR REPLACE FUNCTION batonq.get_task(p_task_id bigint) RETURNS batonq.task_view
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_task batonq.task_view;
BEGIN
    SELECT (batonq._hot_view(t)).* INTO v_task FROM batonq.tasks t WHERE t.id = p_task_id;
    IF NOT FOUND THEN
        SELECT (batonq._archive_view(a)).* INTO v_task FROM batonq.archive a WHERE a.id = p_task_id;
    END IF;
    IF v_task.id IS NULL THEN
        RAISE EXCEPTION 'task % not found', p_task_id
            USING ERRCODE = 'BQ002', DETAIL = jsonb_build_object('task_id', p_task_id)::text;
    END IF;
    RETURN v_task;
END $$;

-- The newest tasks of a queue, optionally in one state; p_before_id pages
-- back (pass the last id you saw).
CREATE OR REPLACE FUNCTION batonq.list_tasks(
    p_queue     text,
    p_state     text DEFAULT NULL,
    p_limit     integer DEFAULT 50,
    p_before_id bigint DEFAULT NULL
) RETURNS SETOF batonq.task_view
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
BEGIN
    PERFORM batonq._check_queue_name(p_queue);
    IF p_state IS NOT NULL AND p_state NOT IN
       ('waiting', 'held', 'pending', 'scheduled', 'leased', 'done', 'dead', 'cancelled') THEN
        PERFORM batonq._invalid_argument(
            'state must be one of waiting, held, pending, scheduled, leased, done, dead, cancelled');
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        PERFORM batonq._invalid_argument('limit must be between 1 and 1000');
    END IF;
    RETURN QUERY
    SELECT v.* FROM (
        (SELECT (batonq._hot_view(t)).* FROM batonq.tasks t
          WHERE t.queue = p_queue AND batonq._in_state(t.state, t.run_at, p_state)
            AND t.id < coalesce(p_before_id, 9223372036854775807)
            AND coalesce(p_state, '') NOT IN ('done', 'dead', 'cancelled')
          ORDER BY t.id DESC LIMIT p_limit)
        -- One index range per finished state, merged: each reads at most
        -- p_limit entries of (queue, state, id DESC).
        UNION ALL
        (SELECT (batonq._archive_view(a)).* FROM batonq.archive a
          WHERE a.queue = p_queue AND a.state = 'done' AND coalesce(p_state, 'done') = 'done'
            AND a.id < coalesce(p_before_id, 9223372036854775807)
          ORDER BY a.id DESC LIMIT p_limit)
        UNION ALL
        (SELECT (batonq._archive_view(a)).* FROM batonq.archive a
          WHERE a.queue = p_queue AND a.state = 'dead' AND coalesce(p_state, 'dead') = 'dead'
            AND a.id < coalesce(p_before_id, 9223372036854775807)
          ORDER BY a.id DESC LIMIT p_limit)
        UNION ALL
        (SELECT (batonq._archive_view(a)).* FROM batonq.archive a
          WHERE a.queue = p_queue AND a.state = 'cancelled' AND coalesce(p_state, 'cancelled') = 'cancelled'
            AND a.id < coalesce(p_before_id, 9223372036854775807)
          ORDER BY a.id DESC LIMIT p_limit)
    ) v
    ORDER BY v.id DESC LIMIT p_limit;
END $$;

-- The writes set aside for these tasks, oldest first per task. A token's
-- holder is read from the attempt history (every lease that ended unfinished
-- left an entry naming its worker and key) or, for the task's newest token,
-- from the task itself.
CREATE OR REPLACE FUNCTION batonq.set_aside_writes(p_task_ids bigint[]) RETURNS SETOF batonq.set_aside_write
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT s.task_id, s.kind, s.fencing_token, s.at, s.state_after,
           coalesce(h.entry ->> 'worker', CASE WHEN v.fencing_token = s.fencing_token THEN v.worker END),
           coalesce((h.entry ->> 'key_id')::bigint,
                    CASE WHEN v.fencing_token = s.fencing_token THEN v.claim_key END)
      FROM batonq.submits s
      LEFT JOIN LATERAL (
          (SELECT t.fencing_token, t.worker, t.claim_key, t.errors FROM batonq.tasks t
            WHERE t.queue = s.queue AND t.id = s.task_id)
          UNION ALL
          (SELECT a.fencing_token, a.worker, NULL::bigint, a.errors FROM batonq.archive a
            WHERE a.id = s.task_id)
          LIMIT 1
      ) v ON true
      LEFT JOIN LATERAL (
          SELECT e.entry FROM jsonb_array_elements(v.errors) AS e(entry)
           WHERE e.entry ->> 'fencing_token' = s.fencing_token::text
           LIMIT 1
      ) h ON true
     WHERE s.task_id = ANY (p_task_ids) AND s.outcome = 'set_aside'
     ORDER BY s.task_id, s.at;
END;

-- Keeps batonq.finished_counts: one delta row per (queue, state) that a
-- statement on the archive changed. Statement triggers with transition
-- tables, so a batch complete adds one row, and every way into or out of the
-- archive (complete, fail, cancel, expiry, the graph, retry, retention) is
-- counted without each of them saying so.
CREATE OR REPLACE FUNCTION batonq._count_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO batonq.finished_counts (queue, state, n)
        SELECT queue, state, count(*) FROM new_rows GROUP BY queue, state;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO batonq.finished_counts (queue, state, n)
        SELECT queue, state, -count(*) FROM old_rows GROUP BY queue, state;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO batonq.finished_counts (queue, state, n)
        SELECT queue, state, sum(n) FROM (
            SELECT queue, state, 1 AS n FROM new_rows
            UNION ALL
            SELECT queue, state, -1 FROM old_rows
        ) d GROUP BY queue, state HAVING sum(n) <> 0;
    ELSE  -- TRUNCATE
        DELETE FROM batonq.finished_counts;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER archive_count_insert AFTER INSERT ON batonq.archive
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION batonq._count_finished();

CREATE OR REPLACE TRIGGER archive_count_delete AFTER DELETE ON batonq.archive
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION batonq._count_finished();

CREATE OR REPLACE TRIGGER archive_count_update AFTER UPDATE ON batonq.archive
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION batonq._count_finished();

CREATE OR REPLACE TRIGGER archive_count_truncate AFTER TRUNCATE ON batonq.archive
    FOR EACH STATEMENT EXECUTE FUNCTION batonq._count_finished();

-- Fold the delta rows into one row per (queue, state). Safe beside
-- concurrent moves and another fold: rows added meanwhile are neither
-- deleted nor summed here, and a row two folds both saw is deleted once.
CREATE OR REPLACE FUNCTION batonq._fold_counts() RETURNS void
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM batonq.finished_counts RETURNING queue, state, n
    )
    INSERT INTO batonq.finished_counts (queue, state, n)
    SELECT queue, state, sum(n) FROM gone GROUP BY queue, state HAVING sum(n) <> 0;
$$;

-- Per queue: its settings, how many tasks are in each state, and the age of
-- the oldest claimable task. NULL p_queue means every queue. A page: the
-- first p_limit queues by name after p_after whose names match one of
-- p_patterns (anchored regular expressions: an API key's scopes); only the
-- page's queues are counted, however many queues there are.
CREATE OR REPLACE FUNCTION batonq.queue_stats(p_queue text DEFAULT NULL, p_after text DEFAULT NULL,
                                   p_limit integer DEFAULT NULL, p_patterns text[] DEFAULT NULL)
RETURNS TABLE (queue text, paused boolean, waiting bigint, held bigint, pending bigint,
               scheduled bigint, leased bigint, done bigint, dead bigint, cancelled bigint,
               oldest_pending_age_s double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT q.name, q.paused,
           coalesce(h.waiting, 0), coalesce(h.held, 0), coalesce(h.pending, 0),
           coalesce(h.scheduled, 0), coalesce(h.leased, 0),
           coalesce(a.done, 0), coalesce(a.dead, 0), coalesce(a.cancelled, 0),
           h.oldest_pending_age_s
      FROM (SELECT * FROM batonq.queues q
             WHERE (p_queue IS NULL OR q.name = p_queue)
               AND (p_after IS NULL OR q.name > p_after)
               AND (p_patterns IS NULL OR q.name ~ ANY (p_patterns))
             ORDER BY q.name LIMIT p_limit) q
      LEFT JOIN LATERAL (
          SELECT count(*) FILTER (WHERE t.state = 'waiting') AS waiting,
                 count(*) FILTER (WHERE t.state = 'held') AS held,
                 count(*) FILTER (WHERE t.state = 'pending' AND t.run_at <= now()) AS pending,
                 count(*) FILTER (WHERE t.state = 'pending' AND t.run_at > now()) AS scheduled,
                 count(*) FILTER (WHERE t.state = 'leased') AS leased,
                 extract(epoch FROM now() - min(t.run_at) FILTER (
                     WHERE t.state = 'pending' AND t.run_at <= now()))::double precision
                     AS oldest_pending_age_s
            FROM batonq.tasks t WHERE t.queue = q.name
      ) h ON true
      LEFT JOIN LATERAL (
          -- Kept as tasks move (batonq._count_finished), not counted here.
          SELECT sum(c.n) FILTER (WHERE c.state = 'done') AS done,
                 sum(c.n) FILTER (WHERE c.state = 'dead') AS dead,
                 sum(c.n) FILTER (WHERE c.state = 'cancelled') AS cancelled
            FROM batonq.finished_counts c WHERE c.queue = q.name
      ) a ON true
     ORDER BY q.name;
END;

-- Every queue's settings, or only those of the queues named (a page of
-- queues reads its own by the primary key, whatever the number of queues).
-- Two branches, not "p_queues IS NULL OR name = ANY (p_queues)": a generic
-- plan of that reads every row; here the unused branch is a one-time filter.
CREATE OR REPLACE FUNCTION batonq.list_queues(p_queues text[] DEFAULT NULL) RETURNS SETOF batonq.queues
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT * FROM batonq.queues WHERE p_queues IS NULL
    UNION ALL
    SELECT * FROM batonq.queues WHERE name = ANY (p_queues)
    ORDER BY name;
END;

CREATE OR REPLACE FUNCTION batonq._wrong_state(p_task_id bigint, p_state text, p_action text, p_allowed text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_state IS NULL THEN
        RAISE EXCEPTION 'task % not found', p_task_id
            USING ERRCODE = 'BQ002', DETAIL = jsonb_build_object('task_id', p_task_id)::text;
    END IF;
    RAISE EXCEPTION 'cannot % task %: it is %, not %', p_action, p_task_id, p_state, p_allowed
        USING ERRCODE = 'BQ007',
              DETAIL = jsonb_build_object('task_id', p_task_id, 'state', p_state)::text;
END $$;

CREATE OR REPLACE FUNCTION batonq._state_of(p_task_id bigint) RETURNS text
LANGUAGE sql STABLE
RETURN coalesce((SELECT state FROM batonq.tasks WHERE id = p_task_id),
                (SELECT state FROM batonq.archive WHERE id = p_task_id LIMIT 1));

-- A finished task back in the hot table, in p_state, from attempt 0, if it
-- is in one of p_from (finished states); its history (errors) is kept.
-- NULL when it is not.
CREATE OR REPLACE FUNCTION batonq._revive(p_task_id bigint, p_state text, p_from text[]) RETURNS batonq.tasks
LANGUAGE plpgsql AS $$
DECLARE
    v_task batonq.tasks;
BEGIN
    WITH revived AS (
        DELETE FROM batonq.archive a WHERE a.id = p_task_id AND a.state = ANY (p_from)
        RETURNING a.*
    )
    INSERT INTO batonq.tasks (id, queue, state, priority, run_at, created_at, payload, attempts,
                              max_attempts, idempotency_key, parent_id, root_id, fencing_token,
                              last_error, errors, join_task_id, fan_index, group_key, trace_context)
    SELECT id, queue, p_state, priority, now(), created_at, payload, 0,
           max_attempts, idempotency_key, parent_id, root_id, fencing_token,
           last_error, errors, join_task_id, fan_index, group_key, trace_context
      FROM revived
    RETURNING * INTO v_task;
    RETURN v_task;
END $$;

-- Operator: run a dead or cancelled task again, from attempt 0. Its history
-- (errors) is kept. A fan-out element takes its place in its join again
-- (batonq._rejoin). A join that has not gathered waits for its elements
-- again -- and gathers at once if they are all finished; it is refused
-- while an element it cannot do without is dead.
CREATE OR REPLACE FUNCTION batonq.retry_task(p_task_id bigint) RETURNS batonq.task_view
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_dead  batonq.archive;
    v_join  batonq.joins;
    v_task  batonq.tasks;
BEGIN
    SELECT * INTO v_dead FROM batonq.archive a
     WHERE a.id = p_task_id AND a.state IN ('dead', 'cancelled') LIMIT 1;
    IF FOUND AND v_dead.join_task_id IS NOT NULL THEN
        PERFORM batonq._rejoin(v_dead);
    END IF;
    SELECT * INTO v_join FROM batonq.joins j WHERE j.join_task_id = p_task_id AND NOT j.resolved FOR UPDATE;
    IF FOUND AND NOT v_join.partial THEN
        v_dead := NULL;
        SELECT * INTO v_dead FROM batonq.archive a
         WHERE a.join_task_id = p_task_id AND a.state IN ('dead', 'cancelled')
         ORDER BY a.fan_index LIMIT 1;
        IF v_dead.id IS NOT NULL THEN
            RAISE EXCEPTION 'cannot retry task %: its element t_% is %; retry that element',
                            p_task_id, v_dead.id, v_dead.state
                USING ERRCODE = 'BQ007',
                      DETAIL = jsonb_build_object('task_id', p_task_id,
                                                  'state', batonq._state_of(p_task_id))::text;
        END IF;
    END IF;
    v_task := batonq._revive(p_task_id, CASE WHEN v_join.join_task_id IS NULL THEN 'pending' ELSE 'waiting' END,
                             ARRAY['dead', 'cancelled']);
    IF v_task.id IS NULL THEN
        PERFORM batonq._wrong_state(p_task_id, batonq._state_of(p_task_id), 'retry', 'dead or cancelled');
    END IF;
    IF v_join.join_task_id IS NULL THEN
        PERFORM batonq._wake(v_task.queue);
    ELSIF v_join.finished >= v_join.expected THEN
        PERFORM batonq._gather(v_join);
        SELECT * INTO v_task FROM batonq.tasks t WHERE t.queue = v_task.queue AND t.id = p_task_id;
    END IF;
    RETURN batonq._hot_view(v_task);
END $$;

-- Operator: cancel an unfinished task. A holder's later complete is refused.
CREATE OR REPLACE FUNCTION batonq.cancel_task(p_task_id bigint) RETURNS batonq.task_view
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_task batonq.archive;
BEGIN
    WITH gone AS (
        DELETE FROM batonq.tasks t WHERE t.id = p_task_id RETURNING t
    )
    INSERT INTO batonq.archive SELECT (batonq._archive_row(g.t, 'cancelled', NULL)).* FROM gone g
    RETURNING * INTO v_task;
    IF v_task.id IS NULL THEN
        PERFORM batonq._wrong_state(p_task_id, batonq._state_of(p_task_id), 'cancel', 'unfinished');
    END IF;
    IF v_task.join_task_id IS NOT NULL THEN
        PERFORM batonq._on_dead(v_task.queue, ARRAY[v_task.id]);
    END IF;
    PERFORM batonq._lease_ended(v_task.queue);
    RETURN batonq._archive_view(v_task);
END $$;

-- Operator: keep a pending task back until released.
CREATE OR REPLACE FUNCTION batonq.hold_task(p_task_id bigint) RETURNS batonq.task_view
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_task batonq.tasks;
BEGIN
    UPDATE batonq.tasks t SET state = 'held' WHERE t.id = p_task_id AND t.state = 'pending'
    RETURNING * INTO v_task;
    IF v_task.id IS NULL THEN
        PERFORM batonq._wrong_state(p_task_id, batonq._state_of(p_task_id), 'hold', 'pending');
    END IF;
    RETURN batonq._hot_view(v_task);
END $$;

-- Operator: make a held task claimable.
CREATE OR REPLACE FUNCTION batonq.release_task(p_task_id bigint) RETURNS batonq.task_view
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_task batonq.tasks;
BEGIN
    UPDATE batonq.tasks t SET state = 'pending'
     WHERE t.id = p_task_id AND t.state = 'held'
    RETURNING * INTO v_task;
    IF v_task.id IS NULL THEN
        PERFORM batonq._wrong_state(p_task_id, batonq._state_of(p_task_id), 'release', 'held');
    END IF;
    PERFORM batonq._wake(v_task.queue);
    RETURN batonq._hot_view(v_task);
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    batonq.get_task(bigint),
    batonq.set_aside_writes(bigint[]),
    batonq.list_tasks(text, text, integer, bigint),
    batonq.queue_stats(text, text, integer, text[]),
    batonq.list_queues(text[])
TO batonq_reader;
GRANT EXECUTE ON FUNCTION
    batonq.retry_task(bigint), batonq.cancel_task(bigint), batonq.hold_task(bigint), batonq.release_task(bigint)
TO batonq_service;

-- engine/maintenance.sql
-- batonq engine: archive partitions and retention.

-- Make the daily partitions of batonq.archive and batonq.submits (UTC days)
-- from p_from for p_days days. A day whose rows already sit in the default
-- partition is skipped: those rows stay there until retention deletes them.
CREATE OR REPLACE FUNCTION batonq.ensure_partitions(p_from date DEFAULT NULL, p_days integer DEFAULT 4)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_from    date := coalesce(p_from, (now() AT TIME ZONE 'UTC')::date - 1);
    v_day     date;
    v_table   text;
    v_name    text;
    v_created integer := 0;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['archive', 'submits'] LOOP
        FOR i IN 0..p_days - 1 LOOP
            v_day := v_from + i;
            v_name := v_table || '_' || to_char(v_day, 'YYYYMMDD');
            CONTINUE WHEN to_regclass('batonq.' || v_name) IS NOT NULL;
            BEGIN
                EXECUTE format('CREATE TABLE batonq.%I PARTITION OF batonq.%I FOR VALUES FROM (%L) TO (%L)',
                               v_name, v_table,
                               v_day::timestamp AT TIME ZONE 'UTC',
                               (v_day + 1)::timestamp AT TIME ZONE 'UTC');
                -- As on every batonq table (migration 0010): no rows for other roles.
                EXECUTE format('ALTER TABLE batonq.%I ENABLE ROW LEVEL SECURITY', v_name);
                v_created := v_created + 1;
            EXCEPTION WHEN check_violation OR duplicate_table THEN
                NULL;
            END;
        END LOOP;
    END LOOP;
    RETURN v_created;
END $$;

-- Retention: finished tasks older than their queue's retention_s go, with
-- their submit records and idempotency keys, debounce windows whose task
-- has finished, the group rate buckets that are full again, and expired
-- dashboard sessions. Whole day
-- partitions older than the longest retention are dropped; queues that keep
-- less lose their older rows by DELETE, p_batch at a time. Returns what it
-- removed.
--
-- A finished fan-out element stays while its join has not gathered (the
-- join waits, or is dead or cancelled and may be retried): the gather reads
-- the elements' results from the archive. A day partition that holds such
-- an element is not dropped; its other rows go row by row. A join's row in
-- batonq.joins goes with its join task.
CREATE OR REPLACE FUNCTION batonq.run_retention(p_batch integer DEFAULT 10000) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_keep_s     integer := coalesce((SELECT max(retention_s) FROM batonq.queues), 604800);
    v_cutoff     date := ((now() - make_interval(secs => v_keep_s)) AT TIME ZONE 'UTC')::date;
    v_part       record;
    v_needed     boolean;
    v_dropped    integer := 0;
    v_rows       integer := 0;
    v_keys       integer := 0;
    v_debounces  integer := 0;
    v_buckets    integer := 0;
    v_sessions   integer := 0;
BEGIN
    FOR v_part IN
        SELECT c.relname
          FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent IN ('batonq.archive'::regclass, 'batonq.submits'::regclass)
           AND c.relname ~ '_[0-9]{8}$'
           AND to_date(right(c.relname, 8), 'YYYYMMDD') < v_cutoff
    LOOP
        IF v_part.relname LIKE 'archive\_%' THEN
            EXECUTE format('SELECT EXISTS (SELECT FROM batonq.%I a JOIN batonq.joins j
                                             ON j.join_task_id = a.join_task_id AND NOT j.resolved)',
                           v_part.relname)
               INTO v_needed;
            CONTINUE WHEN v_needed;
            EXECUTE format('DELETE FROM batonq.joins j USING batonq.%I a WHERE j.join_task_id = a.id',
                           v_part.relname);
        END IF;
        -- Dropping a partition fires no trigger: take its tasks off the counts.
        IF v_part.relname LIKE 'archive\_%' THEN
            EXECUTE format('INSERT INTO batonq.finished_counts (queue, state, n)
                            SELECT queue, state, -count(*) FROM batonq.%I GROUP BY queue, state',
                           v_part.relname);
        END IF;
        EXECUTE format('DROP TABLE batonq.%I', v_part.relname);
        v_dropped := v_dropped + 1;
    END LOOP;

    WITH old AS (
        SELECT a.id, a.finished_at FROM batonq.archive a JOIN batonq.queues q ON q.name = a.queue
         WHERE a.finished_at < now() - make_interval(secs => q.retention_s)
           AND NOT EXISTS (SELECT FROM batonq.joins j
                            WHERE j.join_task_id = a.join_task_id AND NOT j.resolved)
         LIMIT p_batch
    ), gone AS (
        DELETE FROM batonq.archive a USING old
         WHERE a.id = old.id AND a.finished_at = old.finished_at
        RETURNING a.id
    ), joins_gone AS (
        DELETE FROM batonq.joins j USING gone WHERE j.join_task_id = gone.id
    )
    SELECT count(*) INTO v_rows FROM gone;

    DELETE FROM batonq.submits s
     WHERE s.ctid = ANY (ARRAY(
        SELECT s2.ctid FROM batonq.submits s2 JOIN batonq.queues q ON q.name = s2.queue
         WHERE s2.at < now() - make_interval(secs => q.retention_s)
         LIMIT p_batch));

    -- A key is kept while its task is: in the hot table, or in the archive.
    WITH old AS (
        SELECT k.queue, k.key FROM batonq.idempotency_keys k JOIN batonq.queues q ON q.name = k.queue
         WHERE k.created_at < now() - make_interval(secs => q.retention_s)
           AND NOT EXISTS (SELECT FROM batonq.tasks t WHERE t.queue = k.queue AND t.id = k.task_id)
           AND NOT EXISTS (SELECT FROM batonq.archive a WHERE a.id = k.task_id)
         LIMIT p_batch
    )
    DELETE FROM batonq.idempotency_keys k USING old WHERE k.queue = old.queue AND k.key = old.key;
    GET DIAGNOSTICS v_keys = ROW_COUNT;

    -- A baton's identity is kept while the task it came from is.
    DELETE FROM batonq.batons b
     WHERE b.ctid = ANY (ARRAY(
        SELECT b2.ctid FROM batonq.batons b2
         WHERE b2.created_at < now() - make_interval(secs => v_keep_s)
           AND NOT EXISTS (SELECT FROM batonq.archive a WHERE a.id = b2.parent_id)
         LIMIT p_batch));

    -- A debounce window is open while its task waits in the hot table; once
    -- the task has left it (finished), the key's next enqueue opens a new
    -- window anyway, so the row is dead weight. The delete matches the row's
    -- task_id as read: an enqueue that reopened the window meanwhile (a new
    -- task_id) keeps its row.
    WITH old AS (
        SELECT d.queue, d.key, d.task_id FROM batonq.debounces d
         WHERE NOT EXISTS (SELECT FROM batonq.tasks t WHERE t.queue = d.queue AND t.id = d.task_id)
         LIMIT p_batch
    )
    DELETE FROM batonq.debounces d USING old
     WHERE d.queue = old.queue AND d.key = old.key AND d.task_id = old.task_id;
    GET DIAGNOSTICS v_debounces = ROW_COUNT;

    -- A group's rate bucket that is full again (full_at passed) is as good
    -- as none: the row goes (all of a queue's, once it has no group rate).
    -- The delete matches the row's full_at as read: a claim that took a
    -- token meanwhile moved it, and keeps its row.
    WITH idle AS (
        SELECT b.queue, b.group_key, b.full_at FROM batonq.group_rate_buckets b
          LEFT JOIN batonq.queues q ON q.name = b.queue
         WHERE q.group_rate_limit IS NULL OR b.full_at <= now()
         LIMIT p_batch
    )
    DELETE FROM batonq.group_rate_buckets b USING idle
     WHERE b.queue = idle.queue AND b.group_key = idle.group_key AND b.full_at = idle.full_at;
    GET DIAGNOSTICS v_buckets = ROW_COUNT;

    -- An expired session signs nobody in (session_for_auth): the row goes.
    DELETE FROM batonq.dashboard_sessions s
     WHERE s.token_hash = ANY (ARRAY(
        SELECT s2.token_hash FROM batonq.dashboard_sessions s2 WHERE s2.expires_at <= now() LIMIT p_batch));
    GET DIAGNOSTICS v_sessions = ROW_COUNT;

    -- behind: a full batch was removed, so more may be due now.
    RETURN jsonb_build_object('partitions_dropped', v_dropped, 'archived_deleted', v_rows,
                              'keys_deleted', v_keys, 'debounces_deleted', v_debounces,
                              'rate_buckets_deleted', v_buckets, 'sessions_deleted', v_sessions,
                              'behind', v_rows = p_batch OR v_keys = p_batch OR v_debounces = p_batch
                                        OR v_buckets = p_batch OR v_sessions = p_batch);
END $$;

-- What the sweeper runs every minute or so.
CREATE OR REPLACE FUNCTION batonq.maintain() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_report jsonb := jsonb_build_object('partitions_created', batonq.ensure_partitions())
                      || batonq.run_retention();
BEGIN
    PERFORM batonq._fold_counts();
    RETURN v_report;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.maintain() TO batonq_worker;

-- Today's partitions and the next few exist as soon as the schema does, not
-- only after the sweeper's first maintain(); harmless when they already do.
SELECT batonq.ensure_partitions();

-- engine/leaders.sql
-- batonq engine: leader election for the sweepers' duties, by a lease in a
-- row (batonq.leaders). No session state: it works through a transaction
-- pooler, and a leader's term is bounded by the database's clock alone.

-- Lead p_duty for p_lease_s more seconds: renew the lease p_holder holds,
-- or take it over once it has run out (or was given up). The fencing token
-- of the term, NULL while another holds it. A standby reads the row and
-- writes nothing; two standbys taking over at once queue on the row lock,
-- and the second sees the first's term (its WHERE is checked again).
CREATE OR REPLACE FUNCTION batonq.lead(p_duty text, p_holder text, p_lease_s double precision)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_token bigint;
    v_until timestamptz := now() + make_interval(secs => p_lease_s);
BEGIN
    IF p_lease_s IS NULL OR p_lease_s <= 0 OR p_lease_s > 3600 THEN
        PERFORM batonq._invalid_argument('lease_s must be over 0 and at most 3600');
    END IF;
    UPDATE batonq.leaders l
       SET token = CASE WHEN l.holder = p_holder THEN l.token ELSE l.token + 1 END,
           since = CASE WHEN l.holder = p_holder THEN l.since ELSE now() END,
           holder = p_holder, expires_at = v_until
     WHERE l.duty = p_duty AND (l.holder = p_holder OR l.expires_at <= now())
    RETURNING l.token INTO v_token;
    IF NOT FOUND THEN
        INSERT INTO batonq.leaders (duty, holder, token, since, expires_at)
        VALUES (p_duty, p_holder, 1, now(), v_until)
        ON CONFLICT (duty) DO NOTHING
        RETURNING token INTO v_token;
    END IF;
    RETURN v_token;
END $$;

-- Give p_duty up (a sweeper that stops): the next standby takes it at its
-- next look instead of when the lease would have run out.
CREATE OR REPLACE FUNCTION batonq.resign(p_duty text, p_holder text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    WITH gone AS (
        UPDATE batonq.leaders SET expires_at = now()
         WHERE duty = p_duty AND holder = p_holder AND expires_at > now()
        RETURNING 1)
    SELECT EXISTS (SELECT FROM gone);
END;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.lead(text, text, double precision), batonq.resign(text, text)
TO batonq_worker;

-- engine/graph.sql
-- batonq engine: the queue graph. When a task completes, each edge out of its
-- queue turns the result into the next queue's input (the baton), in the
-- transaction that accepts the completion.

-- '/a/b~1c/0' -> {a,b/c,0}; '' or NULL -> {} (the whole document).
CREATE OR REPLACE FUNCTION batonq._pointer_path(p_pointer text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN coalesce(p_pointer, '') = '' THEN '{}'::text[]
            ELSE ARRAY(SELECT replace(replace(part, '~1', '/'), '~0', '~')
                         FROM unnest((string_to_array(p_pointer, '/'))[2:]) AS part) END;

CREATE OR REPLACE FUNCTION batonq._check_pointer(p_what text, p_pointer text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_pointer IS NOT NULL AND p_pointer <> '' AND left(p_pointer, 1) <> '/' THEN
        PERFORM batonq._invalid_argument(format('%s must be a JSON pointer like /items/0, got %L',
                                                p_what, p_pointer));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION batonq._edge_matches(p_edge batonq.edges, p_result jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE
RETURN CASE
    WHEN p_edge.when_pointer IS NULL THEN true
    WHEN p_edge.when_present IS NOT NULL
        THEN (p_result #> batonq._pointer_path(p_edge.when_pointer) IS NOT NULL) = p_edge.when_present
    ELSE coalesce(p_result #> batonq._pointer_path(p_edge.when_pointer) = p_edge.when_equals, false)
END;

-- Add an edge (or replace the edge between the same two queues). An edge
-- that would close a cycle is refused, naming the cycle.
CREATE OR REPLACE FUNCTION batonq.add_edge(
    p_from_queue   text,
    p_to_queue     text,
    p_map          text DEFAULT NULL,
    p_fan_out      text DEFAULT NULL,
    p_when_pointer text DEFAULT NULL,
    p_when_equals  jsonb DEFAULT NULL,
    p_when_present boolean DEFAULT NULL,
    p_is_join      boolean DEFAULT false,
    p_partial      boolean DEFAULT false,
    p_priority     integer DEFAULT NULL,
    p_delay_s      double precision DEFAULT 0
) RETURNS batonq.edge
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_cycle text[];
    v_edge  batonq.edges;
BEGIN
    PERFORM batonq._queue(p_from_queue, true), batonq._queue(p_to_queue, true);
    PERFORM batonq._check_json('when equals', p_when_equals, 131072);
    PERFORM batonq._check_pointer('map', p_map), batonq._check_pointer('fan_out', p_fan_out),
            batonq._check_pointer('when', p_when_pointer);
    IF p_when_pointer IS NULL AND (p_when_equals IS NOT NULL OR p_when_present IS NOT NULL) THEN
        PERFORM batonq._invalid_argument('a when condition needs a pointer');
    END IF;
    IF p_is_join AND p_fan_out IS NOT NULL THEN
        PERFORM batonq._invalid_argument('a join edge collects a fan-out; it cannot fan out itself');
    END IF;
    IF p_delay_s IS NULL OR p_delay_s < 0 THEN
        PERFORM batonq._invalid_argument('delay_s must be >= 0');
    END IF;
    -- One graph change at a time, so two edges added at once cannot close a
    -- cycle that neither sees alone.
    PERFORM pg_advisory_xact_lock(7011828398159458);
    WITH RECURSIVE reach (queue, path) AS (
        SELECT p_to_queue, ARRAY[p_from_queue, p_to_queue]
        UNION ALL
        SELECT e.to_queue, r.path || e.to_queue
          FROM batonq.edges e JOIN reach r ON e.from_queue = r.queue
         WHERE NOT (e.to_queue = ANY (r.path[2:]))
           AND NOT (e.from_queue = p_from_queue AND e.to_queue = p_to_queue)
    )
    SELECT path INTO v_cycle FROM reach WHERE queue = p_from_queue LIMIT 1;
    IF v_cycle IS NOT NULL THEN
        RAISE EXCEPTION 'edge % -> % would close a cycle: %', p_from_queue, p_to_queue,
                        array_to_string(v_cycle, ' -> ')
            USING ERRCODE = 'BQ008', DETAIL = jsonb_build_object('cycle', v_cycle)::text;
    END IF;
    INSERT INTO batonq.edges (from_queue, to_queue, map, fan_out, when_pointer, when_equals,
                              when_present, is_join, partial, priority, delay_s)
    VALUES (p_from_queue, p_to_queue, p_map, p_fan_out, p_when_pointer, p_when_equals,
            p_when_present, p_is_join, p_partial, p_priority, p_delay_s)
    ON CONFLICT (from_queue, to_queue) DO UPDATE SET
        map = EXCLUDED.map, fan_out = EXCLUDED.fan_out, when_pointer = EXCLUDED.when_pointer,
        when_equals = EXCLUDED.when_equals, when_present = EXCLUDED.when_present,
        is_join = EXCLUDED.is_join, partial = EXCLUDED.partial, priority = EXCLUDED.priority,
        delay_s = EXCLUDED.delay_s
    RETURNING * INTO v_edge;
    RETURN ROW(v_edge.from_queue, v_edge.to_queue, v_edge.map, v_edge.fan_out, v_edge.when_pointer,
               v_edge.when_equals, v_edge.when_present, v_edge.is_join, v_edge.partial,
               v_edge.priority, v_edge.delay_s)::batonq.edge;
END $$;

-- Remove an edge: no new batons along it; tasks already handed on go on.
CREATE OR REPLACE FUNCTION batonq.remove_edge(p_from_queue text, p_to_queue text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
BEGIN
    DELETE FROM batonq.edges WHERE from_queue = p_from_queue AND to_queue = p_to_queue;
    RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION batonq.list_edges() RETURNS SETOF batonq.edge
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT from_queue, to_queue, map, fan_out, when_pointer, when_equals, when_present,
           is_join, partial, priority, delay_s
      FROM batonq.edges ORDER BY from_queue, to_queue;
END;

-- Enqueue one baton: a child of p_parent in p_edge's target queue, made
-- once per (parent, edge, index) in batonq.batons, so a replayed or racing
-- completion can never make a second one. It is in its parent's group: the
-- next step of a customer's work counts against that customer's limits.
-- Returns the task's id.
CREATE OR REPLACE FUNCTION batonq._baton(p_edge batonq.edges, p_parent batonq.archive, p_index integer,
                              p_payload jsonb, p_state text, p_join_task_id bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_queue batonq.queues := batonq._queue(p_edge.to_queue, true);
    v_id    bigint := nextval('batonq.task_id_seq');
BEGIN
    INSERT INTO batonq.batons (parent_id, edge_id, fan_index, task_id)
    VALUES (p_parent.id, p_edge.id, p_index, v_id)
    ON CONFLICT (parent_id, edge_id, fan_index) DO NOTHING;
    IF NOT FOUND THEN
        RETURN (SELECT b.task_id FROM batonq.batons b
                 WHERE b.parent_id = p_parent.id AND b.edge_id = p_edge.id AND b.fan_index = p_index);
    END IF;
    INSERT INTO batonq.tasks (id, queue, state, priority, run_at, payload, max_attempts,
                              parent_id, root_id, join_task_id, fan_index, group_key, trace_context)
    VALUES (v_id, p_edge.to_queue, p_state, coalesce(p_edge.priority, p_parent.priority),
            now() + make_interval(secs => p_edge.delay_s), coalesce(p_payload, 'null'),
            v_queue.max_attempts, p_parent.id, p_parent.root_id, p_join_task_id,
            CASE WHEN p_join_task_id IS NOT NULL THEN p_index END, p_parent.group_key,
            p_parent.trace_context);
    IF p_state = 'pending' AND p_edge.delay_s = 0 THEN
        PERFORM batonq._wake(p_edge.to_queue);
    END IF;
    RETURN v_id;
END $$;

-- Fan one finished task out along p_edge; when the target queue has a join
-- edge out, its waiting join task is made first and each element points at it.
CREATE OR REPLACE FUNCTION batonq._fan_out(p_edge batonq.edges, p_task batonq.archive) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_items jsonb := p_task.result #> batonq._pointer_path(p_edge.fan_out);
    v_join  batonq.edges;
    v_join_id bigint;
    v_n     integer;
BEGIN
    IF jsonb_typeof(v_items) IS DISTINCT FROM 'array' THEN
        v_items := '[]';  -- nothing to fan out
    END IF;
    v_n := jsonb_array_length(v_items);
    SELECT * INTO v_join FROM batonq.edges WHERE from_queue = p_edge.to_queue AND is_join LIMIT 1;
    IF FOUND THEN
        v_join_id := batonq._baton(v_join, p_task, 0, '[]',
                                   CASE WHEN v_n = 0 THEN 'pending' ELSE 'waiting' END, NULL);
        INSERT INTO batonq.joins (join_task_id, join_queue, expected, partial, resolved)
        VALUES (v_join_id, v_join.to_queue, v_n, v_join.partial, v_n = 0)
        ON CONFLICT (join_task_id) DO NOTHING;
    END IF;
    FOR i IN 0 .. v_n - 1 LOOP
        PERFORM batonq._baton(p_edge, p_task, i, (v_items -> i) #> batonq._pointer_path(p_edge.map),
                              'pending', v_join_id);
    END LOOP;
END $$;

-- Make a waiting join pending with its elements' results in element order
-- (a dead element's place holds null), once: the join is then resolved,
-- and nothing changes its list again. The caller holds the join's row lock.
CREATE OR REPLACE FUNCTION batonq._gather(p_join batonq.joins) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- A new statement: it sees every element, including those committed
    -- by other transactions while the caller waited on the lock.
    UPDATE batonq.tasks t SET
        state = 'pending',
        run_at = now(),
        payload = (SELECT coalesce(jsonb_agg(a.result ORDER BY a.fan_index), '[]')
                     FROM batonq.archive a WHERE a.join_task_id = p_join.join_task_id)
     WHERE t.queue = p_join.join_queue AND t.id = p_join.join_task_id AND t.state = 'waiting';
    -- Not waiting (dead of an element, or cancelled): nothing gathers, and
    -- the join stays unresolved, so that a retry can bring it back.
    IF FOUND THEN
        UPDATE batonq.joins SET resolved = true WHERE join_task_id = p_join.join_task_id;
        PERFORM batonq._wake(p_join.join_queue);
    END IF;
END $$;

-- A fan-out element finished (p_dead: dead or cancelled). The last one
-- makes its join pending with the ordered results; a dead one makes the join
-- dead at once unless the join takes partial results. Elements are counted
-- until the join has gathered, whatever the join's state: a join that died
-- of an element (or was cancelled) knows how many elements are finished
-- when a retry brings it back (batonq._rejoin, batonq.retry_task).
CREATE OR REPLACE FUNCTION batonq._join_progress(p_join_task_id bigint, p_dead boolean, p_element bigint,
                                      p_error text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_join batonq.joins;
BEGIN
    -- The row lock serialises the elements' completions and retries:
    -- exactly one of them sees the count reach the total.
    UPDATE batonq.joins SET finished = finished + 1
     WHERE join_task_id = p_join_task_id AND NOT resolved
    RETURNING * INTO v_join;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_dead AND NOT v_join.partial THEN
        -- A join task is never an element itself: no join further on learns of it.
        WITH gone AS (
            DELETE FROM batonq.tasks t
             WHERE t.queue = v_join.join_queue AND t.id = p_join_task_id AND t.state = 'waiting'
            RETURNING t
        )
        INSERT INTO batonq.archive
        SELECT (batonq._archive_row(g.t, 'dead', NULL,
                format('fan-out element t_%s is dead: %s', p_element, p_error))).*
          FROM gone g;
    ELSIF v_join.finished >= v_join.expected THEN
        PERFORM batonq._gather(v_join);
    END IF;
END $$;

-- A dead or cancelled element is retried: it takes its place in its join
-- again. Refused (BQ007) when the join has gathered without it or is gone
-- (past retention). A join that died of an element waits again once no
-- element is dead; a cancelled join stays cancelled (retry it to gather).
CREATE OR REPLACE FUNCTION batonq._rejoin(p_element batonq.archive) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_join batonq.joins;
BEGIN
    SELECT * INTO v_join FROM batonq.joins WHERE join_task_id = p_element.join_task_id FOR UPDATE;
    IF NOT FOUND OR v_join.resolved THEN
        RAISE EXCEPTION 'cannot retry task %: its join t_% %', p_element.id, p_element.join_task_id,
                        CASE WHEN FOUND THEN 'has gathered its elements without it'
                             ELSE 'is gone' END
            USING ERRCODE = 'BQ007',
                  DETAIL = jsonb_build_object('task_id', p_element.id, 'state', p_element.state)::text;
    END IF;
    UPDATE batonq.joins SET finished = finished - 1 WHERE join_task_id = v_join.join_task_id;
    IF NOT v_join.partial AND NOT EXISTS (
        SELECT FROM batonq.archive a
         WHERE a.join_task_id = v_join.join_task_id AND a.id <> p_element.id
           AND a.state IN ('dead', 'cancelled'))
    THEN
        PERFORM batonq._revive(v_join.join_task_id, 'waiting', ARRAY['dead']);
    END IF;
END $$;

-- Plain batons (no fan-out, no join) for a batch of tasks just finished
-- (their archive rows) in one statement: the same identities, rows and
-- wake-up as _baton, at set cost. Tasks whose baton exists already get no
-- second one.
CREATE OR REPLACE FUNCTION batonq._batons(p_edge batonq.edges, p_tasks batonq.archive[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_queue batonq.queues := batonq._queue(p_edge.to_queue, true);
    v_made  integer;
BEGIN
    WITH src AS MATERIALIZED (
        SELECT a.id AS parent_id, a.root_id, a.priority, a.result, a.group_key, a.trace_context,
               nextval('batonq.task_id_seq') AS id
          FROM unnest(p_tasks) AS a
         WHERE batonq._edge_matches(p_edge, a.result)
    ), keyed AS (
        -- In parent order, like enqueue_many's keys: racing batches cannot deadlock.
        INSERT INTO batonq.batons (parent_id, edge_id, fan_index, task_id)
        SELECT s.parent_id, p_edge.id, 0, s.id FROM src s ORDER BY s.parent_id
        ON CONFLICT (parent_id, edge_id, fan_index) DO NOTHING
        RETURNING task_id
    )
    INSERT INTO batonq.tasks (id, queue, state, priority, run_at, payload, max_attempts,
                              parent_id, root_id, group_key, trace_context)
    SELECT s.id, p_edge.to_queue, 'pending', coalesce(p_edge.priority, s.priority),
           now() + make_interval(secs => p_edge.delay_s),
           coalesce(s.result #> batonq._pointer_path(p_edge.map), 'null'),
           v_queue.max_attempts, s.parent_id, s.root_id, s.group_key, s.trace_context
      FROM src s
     WHERE s.id IN (SELECT k.task_id FROM keyed k);
    GET DIAGNOSTICS v_made = ROW_COUNT;
    IF v_made > 0 AND p_edge.delay_s = 0 THEN
        PERFORM batonq._wake(p_edge.to_queue);
    END IF;
END $$;

-- Tasks of p_queue just finished as done (archived in this transaction):
-- advance their joins and hand their results on along every edge. Plain
-- edges take the whole batch in one statement; fan-outs and joins go task
-- by task. The archive rows are read once, for all of it.
CREATE OR REPLACE FUNCTION batonq._hand_off(p_queue text, p_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_tasks batonq.archive[] := ARRAY(
        SELECT a FROM batonq.archive a
         WHERE a.finished_at = now() AND a.id = ANY (p_ids) AND a.queue = p_queue AND a.state = 'done'
         ORDER BY a.id);
    v_task  batonq.archive;
    v_edge  batonq.edges;
BEGIN
    FOREACH v_task IN ARRAY v_tasks LOOP
        CONTINUE WHEN v_task.join_task_id IS NULL;
        PERFORM batonq._join_progress(v_task.join_task_id, false, v_task.id, NULL);
    END LOOP;
    FOR v_edge IN SELECT * FROM batonq.edges WHERE from_queue = p_queue ORDER BY to_queue LOOP
        IF NOT v_edge.is_join AND v_edge.fan_out IS NULL THEN
            PERFORM batonq._batons(v_edge, v_tasks);
            CONTINUE;
        END IF;
        FOREACH v_task IN ARRAY v_tasks LOOP
            CONTINUE WHEN NOT batonq._edge_matches(v_edge, v_task.result);
            IF v_edge.is_join THEN
                -- Elements of a fan-out reach the join through it; a task that
                -- was not fanned out joins alone.
                CONTINUE WHEN v_task.join_task_id IS NOT NULL;
                PERFORM batonq._baton(v_edge, v_task, 0,
                    jsonb_build_array(v_task.result #> batonq._pointer_path(v_edge.map)), 'pending', NULL);
            ELSE
                PERFORM batonq._fan_out(v_edge, v_task);
            END IF;
        END LOOP;
    END LOOP;
END $$;

-- Tasks of p_queue just finished dead or cancelled: their joins learn of it.
CREATE OR REPLACE FUNCTION batonq._on_dead(p_queue text, p_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_task record;
BEGIN
    FOR v_task IN
        SELECT a.id, a.join_task_id, coalesce(a.last_error, a.state) AS error FROM batonq.archive a
         WHERE a.finished_at = now() AND a.id = ANY (p_ids) AND a.queue = p_queue
           AND a.join_task_id IS NOT NULL
    LOOP
        PERFORM batonq._join_progress(v_task.join_task_id, true, v_task.id, v_task.error);
    END LOOP;
END $$;

-- The tasks of a run (the tree under one root), oldest first: the first
-- p_limit (NULL: all). The ids are picked first, so a page of a long run
-- reads only its own tasks whole (payload, result, errors), not the run's.
CREATE OR REPLACE FUNCTION batonq.run_tasks(p_root_id bigint, p_limit integer DEFAULT NULL)
RETURNS SETOF batonq.task_view
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    -- With each id, its partition key: the second look goes to one partition.
    WITH shown AS (
        SELECT u.id, u.queue, u.finished_at FROM (
            SELECT t.id, t.queue, NULL::timestamptz AS finished_at FROM batonq.tasks t
             WHERE t.id = p_root_id OR (t.root_id = p_root_id AND t.parent_id IS NOT NULL)
            UNION ALL
            SELECT a.id, a.queue, a.finished_at FROM batonq.archive a
             WHERE a.id = p_root_id OR (a.root_id = p_root_id AND a.parent_id IS NOT NULL)
        ) u ORDER BY u.id LIMIT p_limit
    )
    SELECT v.* FROM (
        SELECT (batonq._hot_view(t)).* FROM shown s
          JOIN batonq.tasks t ON t.id = s.id AND t.queue = s.queue
         WHERE s.finished_at IS NULL
        UNION ALL
        SELECT (batonq._archive_view(a)).* FROM shown s
          JOIN batonq.archive a ON a.id = s.id AND a.finished_at = s.finished_at
    ) v ORDER BY v.id;
END;

-- A run's status, derived: failed (at the task that died first, with its error),
-- running (something unfinished), or done.
CREATE OR REPLACE FUNCTION batonq.run_status(p_root_id bigint) RETURNS batonq.run_status
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_status batonq.run_status;
    v_dead   record;
BEGIN
    SELECT p_root_id, NULL, count(*), count(*) FILTER (WHERE v.finished_at IS NULL),
           count(*) FILTER (WHERE v.state = 'done'), count(*) FILTER (WHERE v.state = 'dead'),
           count(*) FILTER (WHERE v.state = 'cancelled'), NULL, NULL, NULL
      INTO v_status
      FROM batonq.run_tasks(p_root_id) v;
    IF v_status.tasks = 0 THEN
        RAISE EXCEPTION 'run % not found', p_root_id
            USING ERRCODE = 'BQ002', DETAIL = jsonb_build_object('task_id', p_root_id)::text;
    END IF;
    SELECT a.id, a.queue, a.last_error INTO v_dead
      FROM batonq.archive a
     WHERE (a.id = p_root_id OR (a.root_id = p_root_id AND a.parent_id IS NOT NULL)) AND a.state = 'dead'
     -- The first to die; a join that died of its element ranks after it.
     ORDER BY a.finished_at, EXISTS (SELECT FROM batonq.joins j WHERE j.join_task_id = a.id), a.id
     LIMIT 1;
    IF FOUND THEN
        v_status.status := 'failed';
        v_status.failed_task_id := v_dead.id;
        v_status.failed_queue := v_dead.queue;
        v_status.error := v_dead.last_error;
    ELSIF v_status.unfinished > 0 THEN
        v_status.status := 'running';
    ELSE
        v_status.status := 'done';
    END IF;
    RETURN v_status;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.list_edges(), batonq.run_tasks(bigint, integer), batonq.run_status(bigint)
TO batonq_reader;
GRANT EXECUTE ON FUNCTION
    batonq.add_edge(text, text, text, text, text, jsonb, boolean, boolean, boolean, integer, double precision),
    batonq.remove_edge(text, text)
TO batonq_service;

-- engine/keys.sql
-- batonq engine: API keys for the HTTP service and the MCP server.
--
-- A key is bq_<id>_<secret>. Only sha256(secret) is stored; the key is
-- returned once, by create_key. A key has a ring (0 admin, 1 operator,
-- 2 worker, 3 observer: a ring-N key may do all that rings N..3 may) and
-- queue scopes (glob patterns such as 'shop:*'). No role gets the key
-- functions: the service calls them as the schema's owner.
--
-- A dashboard session is a random token in the browser's cookie, only its
-- sha256 stored: signing in with a key starts one, signing out or revoking
-- the key ends it, and it expires 12 hours after sign-in (retention removes
-- it then). The session functions do nothing without a secret (the key's
-- secret hash, which only the owner may read, or the session's token), so
-- batonq_worker may call them: a service that runs as a member of it starts,
-- checks and ends sessions without touching the table.

CREATE OR REPLACE FUNCTION batonq._key_view(k batonq.api_keys) RETURNS batonq.api_key
LANGUAGE sql IMMUTABLE
RETURN ROW(k.id, k.name, k.ring, k.queues, k.created_at, k.last_used_at, k.revoked_at)::batonq.api_key;

-- Make a key; the only time its secret is seen.
CREATE OR REPLACE FUNCTION batonq.create_key(p_ring integer, p_queues text[] DEFAULT '{*}', p_name text DEFAULT '')
RETURNS TABLE (key text, id bigint, name text, ring smallint, queues text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_secret text := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    v_key    batonq.api_keys;
BEGIN
    IF p_ring IS NULL OR p_ring NOT BETWEEN 0 AND 3 THEN
        PERFORM batonq._invalid_argument('ring must be 0 (admin), 1 (operator), 2 (worker) or 3 (observer)');
    END IF;
    IF p_queues IS NULL OR cardinality(p_queues) = 0 OR array_position(p_queues, NULL) IS NOT NULL
       OR EXISTS (SELECT FROM unnest(p_queues) q WHERE q !~ '^[a-z0-9_.:*?\[\]-]{1,128}$') THEN
        PERFORM batonq._invalid_argument(
            'queues must be glob patterns of queue names, such as shop:* or mail:outbox');
    END IF;
    INSERT INTO batonq.api_keys (name, ring, queues, secret_hash)
    VALUES (coalesce(p_name, ''), p_ring, p_queues, sha256(convert_to(v_secret, 'UTF8')))
    RETURNING * INTO v_key;
    RETURN QUERY SELECT 'bq_' || v_key.id || '_' || v_secret, v_key.id, v_key.name, v_key.ring, v_key.queues;
END $$;

-- Mark a key used, at most once a minute, so checking it costs no write
-- per request.
CREATE OR REPLACE FUNCTION batonq._key_used(p_id bigint) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    UPDATE batonq.api_keys SET last_used_at = now()
     WHERE id = p_id AND revoked_at IS NULL
       AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');
END;

-- What the service needs to check a presented key: the stored hash (it
-- compares in constant time itself), ring and scopes. Marks the key used.
CREATE OR REPLACE FUNCTION batonq.key_for_auth(p_id bigint)
RETURNS TABLE (secret_hash bytea, ring smallint, queues text[], revoked boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
BEGIN
    PERFORM batonq._key_used(p_id);
    RETURN QUERY SELECT k.secret_hash, k.ring, k.queues, k.revoked_at IS NOT NULL
                   FROM batonq.api_keys k WHERE k.id = p_id;
END $$;

CREATE OR REPLACE FUNCTION batonq.list_keys() RETURNS SETOF batonq.api_key
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT (batonq._key_view(k)).* FROM batonq.api_keys k ORDER BY k.id;
END;

CREATE OR REPLACE FUNCTION batonq.revoke_key(p_id bigint) RETURNS batonq.api_key
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_key batonq.api_keys;
BEGIN
    UPDATE batonq.api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = p_id
    RETURNING * INTO v_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'key % not found', p_id USING ERRCODE = 'BQ009',
              DETAIL = jsonb_build_object('key_id', p_id)::text;
    END IF;
    -- Signed out everywhere at once (session_for_auth refuses them anyway).
    DELETE FROM batonq.dashboard_sessions WHERE key_id = p_id;
    RETURN batonq._key_view(v_key);
END $$;

-- The first admin key, only while there is no key at all; NULL otherwise.
-- The table lock makes two services starting at once print one key.
CREATE OR REPLACE FUNCTION batonq.create_first_key()
RETURNS TABLE (key text, id bigint, name text, ring smallint, queues text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
BEGIN
    LOCK TABLE batonq.api_keys IN EXCLUSIVE MODE;
    IF NOT EXISTS (SELECT FROM batonq.api_keys) THEN
        RETURN QUERY SELECT * FROM batonq.create_key(0, '{*}', 'first admin');
    END IF;
END $$;

-- Sign in to the dashboard: a session for the key bq_<p_key_id>_<secret>
-- (p_secret_hash is sha256(secret)), under the token whose sha256 is
-- p_token_hash; the key's ring and scopes, or no row for a key that is
-- unknown, revoked or not this secret. The hashes are compared here, not in
-- constant time: a timing difference tells at most how a stored hash
-- begins, and finding a secret with that hash is no easier for it.
CREATE OR REPLACE FUNCTION batonq.create_session(p_key_id bigint, p_secret_hash bytea, p_token_hash bytea)
RETURNS TABLE (key_id bigint, ring smallint, queues text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_key batonq.api_keys;
BEGIN
    SELECT * INTO v_key FROM batonq.api_keys k
     WHERE k.id = p_key_id AND k.secret_hash = p_secret_hash AND k.revoked_at IS NULL
       FOR SHARE;  -- a revoke_key at the same moment ends this session too
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF octet_length(p_token_hash) IS DISTINCT FROM 32 THEN
        PERFORM batonq._invalid_argument('a session token hash is 32 bytes (sha256)');
    END IF;
    INSERT INTO batonq.dashboard_sessions (token_hash, key_id, expires_at)
    VALUES (p_token_hash, v_key.id, now() + interval '12 hours');
    PERFORM batonq._key_used(v_key.id);
    RETURN QUERY SELECT v_key.id, v_key.ring, v_key.queues;
END $$;

-- The key behind a live session (the token whose sha256 is p_token_hash):
-- its id, ring and scopes as they are now; no row once the session expired
-- or ended, or its key was revoked.
CREATE OR REPLACE FUNCTION batonq.session_for_auth(p_token_hash bytea)
RETURNS TABLE (key_id bigint, ring smallint, queues text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_key record;
BEGIN
    SELECT k.id, k.ring, k.queues INTO v_key
      FROM batonq.dashboard_sessions s JOIN batonq.api_keys k ON k.id = s.key_id
     WHERE s.token_hash = p_token_hash AND s.expires_at > now() AND k.revoked_at IS NULL;
    IF FOUND THEN
        PERFORM batonq._key_used(v_key.id);
        RETURN QUERY SELECT v_key.id, v_key.ring, v_key.queues;
    END IF;
END $$;

-- Sign out: the session of the token whose sha256 is p_token_hash ends.
CREATE OR REPLACE FUNCTION batonq.end_session(p_token_hash bytea) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    WITH ended AS (DELETE FROM batonq.dashboard_sessions s WHERE s.token_hash = p_token_hash RETURNING 1)
    SELECT EXISTS (SELECT FROM ended);
END;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
-- Keys and dashboard sessions are the service's (a worker's role that could
-- make a session for any key could act as that key on the dashboard).
REVOKE EXECUTE ON FUNCTION
    batonq.create_session(bigint, bytea, bytea), batonq.session_for_auth(bytea), batonq.end_session(bytea)
FROM batonq_worker;
GRANT EXECUTE ON FUNCTION
    batonq.create_key(integer, text[], text), batonq.key_for_auth(bigint), batonq.list_keys(),
    batonq.revoke_key(bigint), batonq.create_first_key(),
    batonq.create_session(bigint, bytea, bytea), batonq.session_for_auth(bytea), batonq.end_session(bytea)
TO batonq_service;

-- engine/dashboard.sql
-- batonq engine: the reads behind the dashboard (batonq serve, /ui).
--
-- Queue scopes arrive as anchored POSIX regular expressions (the callers
-- translate a key's glob patterns), so a page of queues is cut after the
-- key's scopes are applied and a narrow key still gets full pages.

-- A page of queues (by name, after p_after), with their counts: those whose
-- name matches one of p_scopes and contains p_search.
CREATE OR REPLACE FUNCTION batonq.queue_page(
    p_scopes text[], p_search text DEFAULT NULL, p_after text DEFAULT NULL, p_limit integer DEFAULT 50
)
RETURNS TABLE (queue text, paused boolean, waiting bigint, held bigint, pending bigint,
               scheduled bigint, leased bigint, done bigint, dead bigint, cancelled bigint,
               oldest_pending_age_s double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT s.*
      FROM (SELECT q.name FROM batonq.queues q
             WHERE q.name > coalesce(p_after, '')
               AND q.name ~ ANY (p_scopes)
               AND strpos(q.name, lower(coalesce(p_search, ''))) > 0
             ORDER BY q.name LIMIT least(greatest(p_limit, 1), 500)) n,
           LATERAL batonq.queue_stats(n.name) s
     ORDER BY s.queue;
END;

-- How many queues match (for "n queues" above the page).
CREATE OR REPLACE FUNCTION batonq.queue_count(p_scopes text[], p_search text DEFAULT NULL) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT count(*) FROM batonq.queues q
     WHERE q.name ~ ANY (p_scopes) AND strpos(q.name, lower(coalesce(p_search, ''))) > 0;
END;

-- Finishes per queue and minute over the last p_minutes minutes (the
-- current minute included), for the queues named. Reads only the archive
-- partitions of those minutes.
CREATE OR REPLACE FUNCTION batonq.throughput(p_queues text[], p_minutes integer DEFAULT 15)
RETURNS TABLE (queue text, minute timestamptz, done bigint, dead bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT a.queue, date_trunc('minute', a.finished_at),
           count(*) FILTER (WHERE a.state = 'done'), count(*) FILTER (WHERE a.state = 'dead')
      FROM batonq.archive a
     WHERE a.queue = ANY (p_queues) AND a.state IN ('done', 'dead')
       AND a.finished_at >= date_trunc('minute', now())
                            - make_interval(mins => least(greatest(p_minutes, 1), 1440) - 1)
     GROUP BY 1, 2
     ORDER BY 1, 2;
END;

-- Tasks of a queue, newest first, by state, idempotency key and the worker
-- that last held them; p_before_id pages back.
CREATE OR REPLACE FUNCTION batonq.find_tasks(
    p_queue     text,
    p_state     text DEFAULT NULL,
    p_key       text DEFAULT NULL,
    p_worker    text DEFAULT NULL,
    p_limit     integer DEFAULT 50,
    p_before_id bigint DEFAULT NULL
) RETURNS SETOF batonq.task_view
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_before bigint := coalesce(p_before_id, 9223372036854775807);
    v_limit  integer := least(greatest(p_limit, 1), 1000);
BEGIN
    IF p_key IS NULL AND p_worker IS NULL THEN
        RETURN QUERY SELECT * FROM batonq.list_tasks(p_queue, p_state, p_limit, p_before_id);
        RETURN;
    END IF;
    IF p_key IS NOT NULL THEN
        -- A key names at most one task: found by id, hot or archived.
        RETURN QUERY
        SELECT v.* FROM batonq.idempotency_keys k
         CROSS JOIN LATERAL (
             SELECT (batonq._hot_view(t)).* FROM batonq.tasks t
              WHERE t.queue = p_queue AND t.id = k.task_id
             UNION ALL
             SELECT (batonq._archive_view(a)).* FROM batonq.archive a
              WHERE a.id = k.task_id AND a.queue = p_queue
         ) v
         WHERE k.queue = p_queue AND k.key = p_key AND v.id < v_before
           AND (p_worker IS NULL OR v.worker = p_worker) AND batonq._in_state(v.state, v.run_at, p_state);
        RETURN;
    END IF;
    -- By worker: the queue's rows newest first, filtered (no index by worker).
    RETURN QUERY
    SELECT v.* FROM (
        (SELECT (batonq._hot_view(t)).* FROM batonq.tasks t
          WHERE t.queue = p_queue AND t.id < v_before AND t.worker = p_worker
            AND batonq._in_state(t.state, t.run_at, p_state)
          ORDER BY t.id DESC LIMIT v_limit)
        UNION ALL
        (SELECT (batonq._archive_view(a)).* FROM batonq.archive a
          WHERE a.queue = p_queue AND a.id < v_before AND a.worker = p_worker
            AND batonq._in_state(a.state, a.run_at, p_state)
          ORDER BY a.id DESC LIMIT v_limit)
    ) v
    ORDER BY v.id DESC LIMIT v_limit;
END $$;

-- The tasks whose idempotency key is p_key, across the queues in scope,
-- newest first. One probe of the (queue, key) index per queue: a search
-- costs as many probes as there are queues, and an enqueue pays nothing for
-- it (no index by key alone to keep up).
CREATE OR REPLACE FUNCTION batonq.tasks_by_key(
    p_scopes text[],
    p_key    text,
    p_limit  integer DEFAULT 50
) RETURNS SETOF batonq.task_view
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT v.* FROM batonq.queues q
     CROSS JOIN LATERAL (
         SELECT k.task_id FROM batonq.idempotency_keys k WHERE k.queue = q.name AND k.key = p_key
     ) k
     CROSS JOIN LATERAL (
         SELECT (batonq._hot_view(t)).* FROM batonq.tasks t WHERE t.queue = q.name AND t.id = k.task_id
         UNION ALL
         SELECT (batonq._archive_view(a)).* FROM batonq.archive a WHERE a.id = k.task_id AND a.queue = q.name
     ) v
     WHERE q.name ~ ANY (p_scopes)
     ORDER BY v.id DESC LIMIT least(greatest(p_limit, 1), 1000);
END;

-- Dead tasks across the queues in scope, newest first: optionally of one
-- queue, or with p_error in their last error.
CREATE OR REPLACE FUNCTION batonq.dead_tasks(
    p_scopes    text[],
    p_queue     text DEFAULT NULL,
    p_error     text DEFAULT NULL,
    p_limit     integer DEFAULT 50,
    p_before_id bigint DEFAULT NULL
) RETURNS SETOF batonq.task_view
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT (batonq._archive_view(a)).* FROM batonq.archive a
     WHERE a.state = 'dead' AND a.id < coalesce(p_before_id, 9223372036854775807)
       AND a.queue ~ ANY (p_scopes)
       AND (p_queue IS NULL OR a.queue = p_queue)
       AND (p_error IS NULL OR strpos(lower(coalesce(a.last_error, '')), lower(p_error)) > 0)
     ORDER BY a.id DESC LIMIT least(greatest(p_limit, 1), 1000);
END;

-- Per worker name, over the last p_since_s seconds, on the queues in
-- scope, each attempt counted for the worker that made it: a failed attempt
-- or lease expiry for the worker its attempt history entry names, a task
-- done or dead for the worker that finished it, a refused late write for the
-- worker that held the lease its fencing token names (as
-- batonq.set_aside_writes reads it). The median is of claim-to-finish times
-- of done tasks. A NULL worker collects what no worker name is recorded for
-- (e.g. a write under a lease that was released).
CREATE OR REPLACE FUNCTION batonq.worker_scorecards(p_scopes text[], p_since_s double precision DEFAULT 86400)
RETURNS TABLE (worker text, done bigint, failed bigint, dead bigint, late_writes bigint,
               median_s double precision, last_seen timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    WITH finished AS (
        SELECT a.worker, a.state, a.claimed_at, a.finished_at, a.errors
          FROM batonq.archive a
         WHERE a.queue ~ ANY (p_scopes)
           AND a.finished_at >= now() - make_interval(secs => p_since_s)
    ), attempts AS (
        -- An entry in the window belongs to a finished task only if the
        -- task finished in the window too, so finished covers the archive.
        SELECT e.entry ->> 'worker' AS worker, (e.entry ->> 'at')::timestamptz AS at
          FROM (SELECT t.errors FROM batonq.tasks t
                 WHERE t.queue ~ ANY (p_scopes) AND t.errors <> '[]'::jsonb
                UNION ALL
                SELECT f.errors FROM finished f) h,
               jsonb_array_elements(h.errors) AS e(entry)
         WHERE (e.entry ->> 'at')::timestamptz >= now() - make_interval(secs => p_since_s)
    ), late AS (
        SELECT w.worker FROM batonq.set_aside_writes(ARRAY(
            SELECT DISTINCT s.task_id FROM batonq.submits s
             WHERE s.outcome = 'set_aside' AND s.queue ~ ANY (p_scopes)
               AND s.at >= now() - make_interval(secs => p_since_s))) w
         WHERE w.at >= now() - make_interval(secs => p_since_s)
    )
    -- GROUP BY puts what no worker name is recorded for (NULL) in one row.
    SELECT c.worker, sum(c.done)::bigint, sum(c.failed)::bigint, sum(c.dead)::bigint,
           sum(c.late)::bigint,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY c.took_s) FILTER (WHERE c.done = 1),
           max(c.seen)
      FROM (SELECT f.worker, (f.state = 'done')::int AS done, 0 AS failed, (f.state = 'dead')::int AS dead,
                   0 AS late, extract(epoch FROM f.finished_at - f.claimed_at)::double precision AS took_s,
                   f.finished_at AS seen
              FROM finished f WHERE f.state IN ('done', 'dead')
            UNION ALL
            SELECT a.worker, 0, 1, 0, 0, NULL, a.at FROM attempts a
            UNION ALL
            SELECT l.worker, 0, 0, 0, 1, NULL, NULL FROM late l
            UNION ALL
            -- leases held now, or ended unfinished without an entry (released)
            SELECT t.worker, 0, 0, 0, 0, NULL, t.claimed_at FROM batonq.tasks t
             WHERE t.worker IS NOT NULL AND t.queue ~ ANY (p_scopes)
               AND t.claimed_at >= now() - make_interval(secs => p_since_s)) c
     GROUP BY c.worker
     ORDER BY c.worker NULLS LAST;
END;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    batonq.queue_page(text[], text, text, integer),
    batonq.queue_count(text[], text),
    batonq.throughput(text[], integer),
    batonq.find_tasks(text, text, text, text, integer, bigint),
    batonq.tasks_by_key(text[], text, integer),
    batonq.dead_tasks(text[], text, text, integer, bigint),
    batonq.worker_scorecards(text[], double precision)
TO batonq_reader;

-- engine/audit.sql
-- batonq engine: the audit of settings changes -- who changed a queue's
-- settings or a schedule, when, and from what to what.

-- Who changed a setting: the API key a service acts for (batonq._act_as),
-- else the database role that logged in (session_user: SECURITY DEFINER
-- functions run as their owner, so current_user would always name it).
CREATE OR REPLACE FUNCTION batonq._actor() RETURNS text
LANGUAGE sql STABLE
RETURN coalesce(nullif(current_setting('batonq.actor', true), ''), session_user::text);

-- Name who acts for the rest of this transaction (NULL: the database role).
CREATE OR REPLACE FUNCTION batonq._act_as(p_actor text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('batonq.actor', coalesce(p_actor, ''), true);
END $$;

-- A trigger, so that changes made any way are audited: by the client, by
-- an enqueue that creates its queue, by an UPDATE typed into psql.
-- Schedules' firing bookkeeping (next_tick, last_tick, last_task_id) is
-- not a setting and is left out.
CREATE OR REPLACE FUNCTION batonq._audit_settings() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_before jsonb := CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) - '{next_tick,last_tick,last_task_id}'::text[] END;
    v_after  jsonb := CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) - '{next_tick,last_tick,last_task_id}'::text[] END;
BEGIN
    IF v_before IS DISTINCT FROM v_after THEN
        INSERT INTO batonq.settings_audit (actor, kind, name, before, after)
        VALUES (batonq._actor(), TG_ARGV[0], coalesce(v_after, v_before) ->> 'name', v_before, v_after);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER queues_audit AFTER INSERT OR UPDATE OR DELETE ON batonq.queues
    FOR EACH ROW EXECUTE FUNCTION batonq._audit_settings('queue');

-- Not on the firer's moves (next_tick, last_tick, last_task_id, never
-- audited): ten thousand schedules due at once move in one update, and the
-- trigger would double its cost. A new column of settings is named here.
CREATE OR REPLACE TRIGGER schedules_audit
    AFTER INSERT OR UPDATE OF name, cron, tz, queue, payload, missed, paused, armed_at, created_at OR DELETE
    ON batonq.schedules
    FOR EACH ROW EXECUTE FUNCTION batonq._audit_settings('schedule');

-- The newest audit entries first, optionally of one kind and name; a page
-- ends before the entry before_id.
CREATE OR REPLACE FUNCTION batonq.list_settings_audit(
    p_kind text DEFAULT NULL, p_name text DEFAULT NULL, p_limit integer DEFAULT 50, p_before_id bigint DEFAULT NULL
) RETURNS SETOF batonq.settings_audit
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT * FROM batonq.settings_audit
     WHERE (p_kind IS NULL OR kind = p_kind) AND (p_name IS NULL OR name = p_name)
       AND (p_before_id IS NULL OR id < p_before_id)
     ORDER BY id DESC
     LIMIT least(greatest(p_limit, 1), 1000);
END;

-- A function is executable by PUBLIC when made: take that back. Reading
-- the audit is the service's and the owner's.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.list_settings_audit(text, text, integer, bigint) TO batonq_service;

-- engine/schedules.sql
-- batonq engine: cron schedules. Cron expressions are read by the firer
-- (batonq.schedules, in Python, with a cron library): PostgreSQL has no cron
-- arithmetic. The engine keeps the rest: which tick is due, the missed-tick
-- policy, and that each tick of a schedule enqueues at most one task
-- whoever fires it and however often.

CREATE OR REPLACE FUNCTION batonq._schedule_not_found(p_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'schedule % does not exist', p_name
        USING ERRCODE = 'BQ012', DETAIL = jsonb_build_object('schedule', p_name)::text;
END $$;

-- Create a schedule, or replace the one of that name (which re-arms it:
-- its next tick is the first after now). The cron expression is checked by
-- the client that calls this (PostgreSQL cannot read cron); a bad one
-- written here directly is logged and skipped by the firer.
CREATE OR REPLACE FUNCTION batonq.add_schedule(
    p_name    text,
    p_cron    text,
    p_queue   text,
    p_payload jsonb DEFAULT '{}',
    p_tz      text DEFAULT 'UTC',
    p_missed  text DEFAULT 'fire-once',
    p_actor   text DEFAULT NULL
) RETURNS batonq.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_queue    batonq.queues;
    v_schedule batonq.schedules;
BEGIN
    PERFORM batonq._check_queue_name(p_queue);
    IF p_name IS NULL OR NOT batonq._valid_queue_name(p_name) THEN
        PERFORM batonq._invalid_argument(format(
            'invalid schedule name %s: use 1-128 characters from a-z 0-9 _ . : - starting with a letter or digit',
            coalesce(quote_literal(p_name), 'NULL')));
    END IF;
    IF p_cron IS NULL OR length(p_cron) NOT BETWEEN 1 AND 200 THEN
        PERFORM batonq._invalid_argument('cron must be a cron expression of at most 200 characters');
    END IF;
    IF p_missed IS NULL OR p_missed NOT IN ('fire-once', 'skip') THEN
        PERFORM batonq._invalid_argument('missed must be fire-once or skip');
    END IF;
    IF p_tz IS NULL OR NOT EXISTS (SELECT FROM pg_timezone_names WHERE name = p_tz) THEN
        PERFORM batonq._invalid_argument(format('unknown time zone %s: use an IANA name such as Europe/Berlin',
                                                coalesce(quote_literal(p_tz), 'NULL')));
    END IF;
    -- Acting as p_actor before the queue is made: its creation is audited as them too.
    PERFORM batonq._act_as(p_actor);
    v_queue := batonq._queue(p_queue, true);
    PERFORM batonq._check_json('payload', coalesce(p_payload, 'null'), v_queue.max_body_bytes);
    INSERT INTO batonq.schedules (name, cron, tz, queue, payload, missed)
    VALUES (p_name, p_cron, p_tz, p_queue, coalesce(p_payload, 'null'), p_missed)
    ON CONFLICT (name) DO UPDATE
       SET cron = excluded.cron, tz = excluded.tz, queue = excluded.queue, payload = excluded.payload,
           missed = excluded.missed, armed_at = now(), next_tick = NULL
    RETURNING * INTO v_schedule;
    PERFORM batonq._act_as(NULL);
    RETURN v_schedule;
END $$;

-- Remove a schedule (its firing records go with it); false if none.
CREATE OR REPLACE FUNCTION batonq.remove_schedule(p_name text, p_actor text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_removed boolean;
BEGIN
    PERFORM batonq._act_as(p_actor);
    DELETE FROM batonq.schedules WHERE name = p_name;
    v_removed := FOUND;
    PERFORM batonq._act_as(NULL);
    RETURN v_removed;
END $$;

-- Pause a schedule (no ticks fire), or resume it. Resuming re-arms it:
-- ticks that passed while it was paused are not fired, whatever its
-- missed-tick setting (that covers outages of the firer, not pauses).
CREATE OR REPLACE FUNCTION batonq.pause_schedule(p_name text, p_paused boolean, p_actor text DEFAULT NULL)
RETURNS batonq.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_schedule batonq.schedules;
BEGIN
    PERFORM batonq._act_as(p_actor);
    UPDATE batonq.schedules
       SET paused = p_paused,
           armed_at = CASE WHEN paused AND NOT p_paused THEN now() ELSE armed_at END,
           next_tick = CASE WHEN paused AND NOT p_paused THEN NULL ELSE next_tick END
     WHERE name = p_name
    RETURNING * INTO v_schedule;
    IF NOT FOUND THEN
        PERFORM batonq._schedule_not_found(p_name);
    END IF;
    PERFORM batonq._act_as(NULL);
    RETURN v_schedule;
END $$;

-- Every schedule, or only those of the queues named (a page of queues reads
-- its own by the queue's index); two branches as in list_queues.
CREATE OR REPLACE FUNCTION batonq.list_schedules(p_queues text[] DEFAULT NULL) RETURNS SETOF batonq.schedules
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT * FROM batonq.schedules WHERE p_queues IS NULL
    UNION ALL
    SELECT * FROM batonq.schedules WHERE queue = ANY (p_queues)
    ORDER BY name;
END;

-- One schedule by name (no row if there is none): what a change of one
-- schedule checks, read by its key rather than from the whole list.
CREATE OR REPLACE FUNCTION batonq.get_schedule(p_name text) RETURNS SETOF batonq.schedules
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT * FROM batonq.schedules WHERE name = p_name;
END;

-- The schedules whose next tick has come (or is not computed yet), with
-- the database's clock: the firer reckons ticks by it, never by its own.
-- A page of them by name, after p_after: the firer reads every page in a
-- round, so no number of schedules due at once leaves one for a later round
-- (and those it cannot read, whose ticks stay due, hold no page up).
CREATE OR REPLACE FUNCTION batonq.due_schedules(p_limit integer DEFAULT 1000, p_after text DEFAULT NULL)
RETURNS SETOF batonq.due_schedule
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT name, cron, tz, armed_at, next_tick, now() FROM batonq.schedules
     WHERE NOT paused AND (next_tick IS NULL OR next_tick <= now())
       AND (p_after IS NULL OR name > p_after)
     ORDER BY name
     LIMIT p_limit;
END;

-- Fire the due ticks of a batch of schedules (a page of due_schedules) in
-- one call, and move each on to its next tick, the first after now. The
-- arrays run in parallel, one entry a schedule: its name, and the
-- (armed_at, next_tick) the firer read from due_schedules; p_missed, if
-- any, the newest of the ticks that passed while no firer ran, fired once
-- on behalf of them all when the schedule says 'fire-once'; p_next_ticks.
-- The ticks due on time are p_ticks, each naming its schedule by position
-- in p_tick_of (counted from 1). A schedule moves on for one caller only (a
-- compare-and-set under its row lock), so a tick fires once even when two
-- processes both believed themselves the firer, or one repeats a call after
-- a lost reply. Returns the number of tasks enqueued.
CREATE OR REPLACE FUNCTION batonq.fire_schedules(
    p_names      text[],
    p_armed_at   timestamptz[],
    p_expected   timestamptz[],
    p_missed     timestamptz[],
    p_next_ticks timestamptz[],
    p_tick_of    integer[],
    p_ticks      timestamptz[]
) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_moved    text[];
    v_next     timestamptz[];
    v_names    text[];
    v_queues   text[];
    v_payloads jsonb[];
    v_ticks    timestamptz[];
    v_catch_up boolean[];
    v_tasks    bigint[] := '{}';
    v_ids      bigint[];
    v_queue    text;
    v_from     integer;
    v_to       integer;
BEGIN
    -- The compare-and-set: the schedules still as the firer read them,
    -- locked in name order (two firers given overlapping batches wait for
    -- each other instead of deadlocking; the second finds them moved on).
    SELECT array_agg(l.name ORDER BY l.name), array_agg(l.next_tick ORDER BY l.name)
      INTO v_moved, v_next
      FROM (SELECT s.name, f.next_tick FROM batonq.schedules s
              JOIN unnest(p_names, p_armed_at, p_expected, p_next_ticks)
                   AS f(name, armed_at, expected, next_tick) ON s.name = f.name
             WHERE NOT s.paused AND s.armed_at = f.armed_at AND s.next_tick IS NOT DISTINCT FROM f.expected
             ORDER BY s.name
               FOR UPDATE OF s) l;
    -- The ticks to fire, by queue (each queue's are enqueued in one call)
    -- and in time: those on time, and the missed one when the schedule says
    -- so; none from before the schedule was armed, nor fired already.
    WITH moved AS (
        SELECT f.ord, s.name, s.queue, s.payload, s.armed_at, s.missed, f.missed AS missed_tick
          FROM unnest(p_names, p_missed) WITH ORDINALITY AS f(name, missed, ord)
          JOIN unnest(v_moved) AS m(name) ON m.name = f.name
          JOIN batonq.schedules s ON s.name = f.name
    ), due AS (
        SELECT m.name, m.queue, m.payload, m.armed_at, m.missed_tick AS tick, true AS catch_up
          FROM moved m WHERE m.missed = 'fire-once'
        UNION ALL
        SELECT m.name, m.queue, m.payload, m.armed_at, u.tick, false
          FROM moved m JOIN unnest(p_tick_of, p_ticks) AS u(ord, tick) ON u.ord = m.ord
    )
    SELECT array_agg(name ORDER BY queue, tick, name), array_agg(queue ORDER BY queue, tick, name),
           array_agg(payload ORDER BY queue, tick, name), array_agg(tick ORDER BY queue, tick, name),
           array_agg(catch_up ORDER BY queue, tick, name)
      INTO v_names, v_queues, v_payloads, v_ticks, v_catch_up
      FROM due d
     WHERE d.tick IS NOT NULL AND d.tick > d.armed_at AND d.tick <= now()
       AND NOT EXISTS (SELECT FROM batonq.schedule_firings g WHERE g.schedule = d.name AND g.tick = d.tick);
    FOR v_queue, v_from, v_to IN
        SELECT q, min(i), max(i) FROM unnest(v_queues) WITH ORDINALITY AS u(q, i) GROUP BY q ORDER BY 2
    LOOP
        BEGIN
            SELECT array_agg(e.task_id ORDER BY e.ord) INTO STRICT v_ids
              FROM batonq.enqueue_many(v_queue, v_payloads[v_from:v_to]) e;
        EXCEPTION WHEN SQLSTATE 'BQ001' OR SQLSTATE 'BQ003' OR SQLSTATE 'BQ004' OR SQLSTATE 'BQ010'
                    OR SQLSTATE 'BQ011' THEN
            -- The queue refuses a payload (its max_body_bytes was lowered
            -- since, say): each tick of this queue alone, and a refused one
            -- is skipped, as if missed, and its schedule goes on (the firer
            -- logs the warning). An error here would undo the move to the
            -- next tick, and the schedule would come due again every round.
            v_ids := '{}';
            FOR i IN v_from..v_to LOOP
                BEGIN
                    v_ids := v_ids || (batonq.enqueue(v_queue, v_payloads[i])).task_id;
                EXCEPTION WHEN SQLSTATE 'BQ001' OR SQLSTATE 'BQ003' OR SQLSTATE 'BQ004' OR SQLSTATE 'BQ010'
                            OR SQLSTATE 'BQ011' THEN
                    RAISE WARNING 'schedule % did not fire its tick of %: %', v_names[i], v_ticks[i], SQLERRM;
                    v_ids := v_ids || NULL::bigint;
                END;
            END LOOP;
        END;
        v_tasks := v_tasks || v_ids;
    END LOOP;
    INSERT INTO batonq.schedule_firings (schedule, tick, task_id, catch_up)
    SELECT f.name, f.tick, f.task_id, f.catch_up
      FROM unnest(v_names, v_ticks, v_tasks, v_catch_up) AS f(name, tick, task_id, catch_up)
     WHERE f.task_id IS NOT NULL;
    -- Each schedule moves on, with its newest firing, in one update.
    UPDATE batonq.schedules s
       SET next_tick = m.next_tick, last_tick = coalesce(l.tick, s.last_tick),
           last_task_id = coalesce(l.task_id, s.last_task_id)
      FROM unnest(v_moved, v_next) AS m(name, next_tick)
      LEFT JOIN (SELECT DISTINCT ON (f.name) f.name, f.tick, f.task_id
                   FROM unnest(v_names, v_ticks, v_tasks) AS f(name, tick, task_id)
                  WHERE f.task_id IS NOT NULL
                  ORDER BY f.name, f.tick DESC) l ON l.name = m.name
     WHERE s.name = m.name;
    -- Firing records are kept a week: long enough to audit, and an old
    -- tick can never come due again (next_tick only moves forward).
    DELETE FROM batonq.schedule_firings g USING unnest(v_moved) AS m(name)
     WHERE g.schedule = m.name AND g.tick < now() - interval '7 days';
    RETURN (SELECT count(*) FROM unnest(v_tasks) AS t(id) WHERE t.id IS NOT NULL);
END $$;

-- One schedule's batch (the firer of earlier releases calls this).
CREATE OR REPLACE FUNCTION batonq.fire_schedule(
    p_name       text,
    p_armed_at   timestamptz,
    p_expected   timestamptz,
    p_missed     timestamptz,
    p_ticks      timestamptz[],
    p_next_tick  timestamptz
) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT batonq.fire_schedules(ARRAY[p_name], ARRAY[p_armed_at], ARRAY[p_expected], ARRAY[p_missed],
                                 ARRAY[p_next_tick], array_fill(1, ARRAY[coalesce(cardinality(p_ticks), 0)]),
                                 p_ticks);
END;

-- The firings of a schedule, newest first.
CREATE OR REPLACE FUNCTION batonq.list_schedule_firings(p_name text, p_limit integer DEFAULT 50)
RETURNS SETOF batonq.schedule_firings
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT * FROM batonq.schedule_firings WHERE schedule = p_name
     ORDER BY tick DESC LIMIT least(greatest(p_limit, 1), 10000);
END;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.list_schedules(text[]), batonq.get_schedule(text) TO batonq_reader;
GRANT EXECUTE ON FUNCTION
    batonq.due_schedules(integer, text),
    batonq.fire_schedules(text[], timestamptz[], timestamptz[], timestamptz[], timestamptz[], integer[], timestamptz[]),
    batonq.fire_schedule(text, timestamptz, timestamptz, timestamptz, timestamptz[], timestamptz)
TO batonq_worker;
GRANT EXECUTE ON FUNCTION
    batonq.add_schedule(text, text, text, jsonb, text, text, text), batonq.remove_schedule(text, text),
    batonq.pause_schedule(text, boolean, text), batonq.list_schedule_firings(text, integer)
TO batonq_service;

-- engine/debounce.sql
-- batonq engine: debounced enqueue.

-- Enqueue with debounce: enqueues of one key within p_debounce_s of each
-- other collapse into one task, which becomes claimable p_debounce_s after
-- the last of them -- or p_max_wait_s after the first, so that a steady
-- stream still runs. p_keep says whose payload the task carries: 'last'
-- (each enqueue replaces it) or 'first'. Once the task has been claimed, the
-- next enqueue of the key opens a new window with a new task.
--
-- Enqueues of one key queue on a transaction-scoped advisory lock, so the
-- window's row and its task change together, one enqueue at a time; a
-- claim that takes the task meanwhile holds its row lock, and the update
-- below then finds it no longer pending and opens a new window instead.
CREATE OR REPLACE FUNCTION batonq.enqueue_debounced(
    p_queue        text,
    p_key          text,
    p_payload      jsonb,
    p_debounce_s   double precision,
    p_max_wait_s   double precision DEFAULT NULL,
    p_keep         text DEFAULT 'last',
    p_priority     integer DEFAULT 0,
    p_max_attempts integer DEFAULT NULL,
    p_group        text DEFAULT NULL
) RETURNS batonq.enqueued
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_queue   batonq.queues := batonq._queue(p_queue, true);
    v_window  batonq.debounces;
    v_reply   batonq.enqueued;
BEGIN
    IF p_key IS NULL OR length(p_key) NOT BETWEEN 1 AND 512 THEN
        PERFORM batonq._invalid_argument('debounce_key must be 1-512 characters');
    END IF;
    IF p_debounce_s IS NULL OR p_debounce_s <= 0 OR p_debounce_s > 86400 THEN
        PERFORM batonq._invalid_argument('debounce_s must be over 0 and at most 86400 (a day)');
    END IF;
    IF p_max_wait_s IS NOT NULL AND (p_max_wait_s < p_debounce_s OR p_max_wait_s > 315360000) THEN
        PERFORM batonq._invalid_argument('max_wait_s must be at least debounce_s and at most 315360000 (10 years)');
    END IF;
    IF p_keep IS NULL OR p_keep NOT IN ('first', 'last') THEN
        PERFORM batonq._invalid_argument('keep must be first or last');
    END IF;
    PERFORM batonq._check_enqueue_args(p_priority, 0, p_max_attempts);
    PERFORM batonq._check_group(p_group);
    PERFORM batonq._check_json('payload', p_payload, v_queue.max_body_bytes);
    PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || E'\n' || p_key, 13));

    SELECT * INTO v_window FROM batonq.debounces WHERE queue = p_queue AND key = p_key;
    IF FOUND THEN
        UPDATE batonq.tasks
           SET run_at = least(now() + make_interval(secs => p_debounce_s),
                              v_window.opened_at + make_interval(secs => coalesce(p_max_wait_s, 315360000))),
               payload = CASE WHEN p_keep = 'last' THEN p_payload ELSE payload END,
               group_key = CASE WHEN p_keep = 'last' THEN p_group ELSE group_key END
         -- Never claimed (no fencing token yet): a task that was claimed,
         -- even one pending again for a retry, has closed its window.
         WHERE queue = p_queue AND id = v_window.task_id AND state = 'pending'
           AND fencing_token IS NULL
        RETURNING id, queue, false, state, run_at INTO v_reply;
        IF FOUND THEN
            RETURN v_reply;
        END IF;
    END IF;
    -- No open window (none yet, or its task was claimed, held or finished).
    v_reply := batonq.enqueue(p_queue, p_payload, p_priority, p_debounce_s, p_max_attempts,
                              p_group => p_group);
    INSERT INTO batonq.debounces (queue, key, task_id, opened_at)
    VALUES (p_queue, p_key, v_reply.task_id, now())
    ON CONFLICT (queue, key) DO UPDATE SET task_id = excluded.task_id, opened_at = excluded.opened_at;
    RETURN v_reply;
END $$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    batonq.enqueue_debounced(text, text, jsonb, double precision, double precision, text, integer, integer, text)
TO batonq_worker;

-- the engine applied
WITH gone AS (DELETE FROM batonq.engine)
INSERT INTO batonq.engine (sha256) VALUES ('9f1f97139089f56d42f46040ddef7470fb88b2126b4a10be77d19bb64a7f767c');

COMMIT;
