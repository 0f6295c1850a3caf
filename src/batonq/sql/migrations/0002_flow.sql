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
