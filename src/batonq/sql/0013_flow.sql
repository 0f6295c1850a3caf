-- batonq 0013: flow control -- cron schedules, debounced enqueue, and the
-- audit of every change to queue settings and schedules.
--
-- Cron expressions are read by the firer (batonq.schedules, in Python, with
-- a cron library): PostgreSQL has no cron arithmetic. The engine keeps the
-- rest: which tick is due, the missed-tick policy, and that each tick of a
-- schedule enqueues at most one task whoever fires it and however often.

-- Who changed a setting: the API key a service acts for (batonq._act_as),
-- else the database role that logged in (session_user: SECURITY DEFINER
-- functions run as their owner, so current_user would always name it).
CREATE FUNCTION batonq._actor() RETURNS text
LANGUAGE sql STABLE
RETURN coalesce(nullif(current_setting('batonq.actor', true), ''), session_user::text);

-- Name who acts for the rest of this transaction (NULL: the database role).
CREATE FUNCTION batonq._act_as(p_actor text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('batonq.actor', coalesce(p_actor, ''), true);
END $$;

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

-- A trigger, so that changes made any way are audited: by the client, by
-- an enqueue that creates its queue, by an UPDATE typed into psql.
-- Schedules' firing bookkeeping (next_tick, last_tick, last_task_id) is
-- not a setting and is left out.
CREATE FUNCTION batonq._audit_settings() RETURNS trigger
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

CREATE TRIGGER queues_audit AFTER INSERT OR UPDATE OR DELETE ON batonq.queues
    FOR EACH ROW EXECUTE FUNCTION batonq._audit_settings('queue');

-- configure_queue on behalf of p_actor (a service's API key), audited so.
CREATE FUNCTION batonq.configure_queue_as(
    p_actor          text,
    p_queue          text,
    p_lease_s        integer DEFAULT NULL,
    p_max_attempts   integer DEFAULT NULL,
    p_backoff_base_s double precision DEFAULT NULL,
    p_backoff_max_s  double precision DEFAULT NULL,
    p_retention_s    integer DEFAULT NULL,
    p_max_body_bytes integer DEFAULT NULL,
    p_paused         boolean DEFAULT NULL
) RETURNS batonq.queues
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_queue batonq.queues;
BEGIN
    PERFORM batonq._act_as(p_actor);
    v_queue := batonq.configure_queue(p_queue, p_lease_s, p_max_attempts, p_backoff_base_s,
                                      p_backoff_max_s, p_retention_s, p_max_body_bytes, p_paused);
    PERFORM batonq._act_as(NULL);
    RETURN v_queue;
END $$;

-- The newest audit entries first, optionally of one kind and name; a page
-- ends before the entry before_id.
CREATE FUNCTION batonq.list_settings_audit(
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

-- ---------------------------------------------------------------- schedules

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

CREATE TRIGGER schedules_audit AFTER INSERT OR UPDATE OR DELETE ON batonq.schedules
    FOR EACH ROW EXECUTE FUNCTION batonq._audit_settings('schedule');

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

CREATE FUNCTION batonq._schedule_not_found(p_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'schedule % does not exist', p_name
        USING ERRCODE = 'BQ012', DETAIL = jsonb_build_object('schedule', p_name)::text;
END $$;

-- Create a schedule, or replace the one of that name (which re-arms it:
-- its next tick is the first after now). The cron expression is checked by
-- the client that calls this (PostgreSQL cannot read cron); a bad one
-- written here directly is logged and skipped by the firer.
CREATE FUNCTION batonq.add_schedule(
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
    v_queue    batonq.queues := batonq._queue(p_queue, true);
    v_schedule batonq.schedules;
BEGIN
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
    PERFORM batonq._check_json('payload', coalesce(p_payload, 'null'), v_queue.max_body_bytes);
    PERFORM batonq._act_as(p_actor);
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
CREATE FUNCTION batonq.remove_schedule(p_name text, p_actor text DEFAULT NULL) RETURNS boolean
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
CREATE FUNCTION batonq.pause_schedule(p_name text, p_paused boolean, p_actor text DEFAULT NULL)
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

CREATE FUNCTION batonq.list_schedules() RETURNS SETOF batonq.schedules
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT * FROM batonq.schedules ORDER BY name;
END;

CREATE TYPE batonq.due_schedule AS (
    name text, cron text, tz text, armed_at timestamptz, next_tick timestamptz, now timestamptz
);

-- The schedules whose next tick has come (or is not computed yet), with
-- the database's clock: the firer reckons ticks by it, never by its own.
CREATE FUNCTION batonq.due_schedules(p_limit integer DEFAULT 100) RETURNS SETOF batonq.due_schedule
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT name, cron, tz, armed_at, next_tick, now() FROM batonq.schedules
     WHERE NOT paused AND (next_tick IS NULL OR next_tick <= now())
     ORDER BY next_tick NULLS FIRST
     LIMIT p_limit;
END;

-- Fire a schedule's due ticks and move it on to p_next_tick, the first
-- tick after now. The firer read (armed_at, next_tick) from due_schedules
-- and names them again: the update below succeeds for one caller only (a
-- compare-and-set under the schedule's row lock), so a tick fires once even
-- when two processes both believed themselves the firer, or one repeats a
-- call after a lost reply. p_ticks are the ticks due on time; p_missed, if
-- any, the newest of the ticks that passed while no firer ran, fired once
-- on behalf of them all when the schedule says 'fire-once'. Returns the
-- number of tasks enqueued.
CREATE FUNCTION batonq.fire_schedule(
    p_name       text,
    p_armed_at   timestamptz,
    p_expected   timestamptz,
    p_missed     timestamptz,
    p_ticks      timestamptz[],
    p_next_tick  timestamptz
) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_schedule batonq.schedules;
    v_tick     timestamptz;
    v_catch_up boolean;
    v_task     batonq.enqueued;
    v_fired    integer := 0;
BEGIN
    UPDATE batonq.schedules SET next_tick = p_next_tick
     WHERE name = p_name AND NOT paused AND armed_at = p_armed_at
       AND next_tick IS NOT DISTINCT FROM p_expected
    RETURNING * INTO v_schedule;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    FOR v_tick, v_catch_up IN
        SELECT t.tick, t.catch_up
          FROM (SELECT p_missed AS tick, true AS catch_up WHERE v_schedule.missed = 'fire-once'
                UNION ALL
                SELECT u, false FROM unnest(p_ticks) AS u) t
         WHERE t.tick IS NOT NULL AND t.tick > v_schedule.armed_at AND t.tick <= now()
           AND NOT EXISTS (SELECT FROM batonq.schedule_firings f
                            WHERE f.schedule = p_name AND f.tick = t.tick)
         ORDER BY t.tick
    LOOP
        v_task := batonq.enqueue(v_schedule.queue, v_schedule.payload);
        INSERT INTO batonq.schedule_firings (schedule, tick, task_id, catch_up)
        VALUES (p_name, v_tick, v_task.task_id, v_catch_up);
        UPDATE batonq.schedules SET last_tick = v_tick, last_task_id = v_task.task_id WHERE name = p_name;
        v_fired := v_fired + 1;
    END LOOP;
    -- Firing records are kept a week: long enough to audit, and an old
    -- tick can never come due again (next_tick only moves forward).
    DELETE FROM batonq.schedule_firings WHERE schedule = p_name AND tick < now() - interval '7 days';
    RETURN v_fired;
END $$;

-- The firings of a schedule, newest first.
CREATE FUNCTION batonq.list_schedule_firings(p_name text, p_limit integer DEFAULT 50)
RETURNS SETOF batonq.schedule_firings
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT * FROM batonq.schedule_firings WHERE schedule = p_name
     ORDER BY tick DESC LIMIT least(greatest(p_limit, 1), 10000);
END;

-- ---------------------------------------------------------------- debounce

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
CREATE FUNCTION batonq.enqueue_debounced(
    p_queue        text,
    p_key          text,
    p_payload      jsonb,
    p_debounce_s   double precision,
    p_max_wait_s   double precision DEFAULT NULL,
    p_keep         text DEFAULT 'last',
    p_priority     integer DEFAULT 0,
    p_max_attempts integer DEFAULT NULL
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
    PERFORM batonq._check_json('payload', p_payload, v_queue.max_body_bytes);
    PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || E'\n' || p_key, 13));

    SELECT * INTO v_window FROM batonq.debounces WHERE queue = p_queue AND key = p_key;
    IF FOUND THEN
        UPDATE batonq.tasks
           SET run_at = least(now() + make_interval(secs => p_debounce_s),
                              v_window.opened_at + make_interval(secs => coalesce(p_max_wait_s, 315360000))),
               payload = CASE WHEN p_keep = 'last' THEN p_payload ELSE payload END
         WHERE queue = p_queue AND id = v_window.task_id AND state = 'pending'
        RETURNING id, queue, false, state, run_at INTO v_reply;
        IF FOUND THEN
            RETURN v_reply;
        END IF;
    END IF;
    -- No open window (none yet, or its task was claimed, held or finished).
    v_reply := batonq.enqueue(p_queue, p_payload, p_priority, p_debounce_s, p_max_attempts);
    INSERT INTO batonq.debounces (queue, key, task_id, opened_at)
    VALUES (p_queue, p_key, v_reply.task_id, now())
    ON CONFLICT (queue, key) DO UPDATE SET task_id = excluded.task_id, opened_at = excluded.opened_at;
    RETURN v_reply;
END $$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.list_schedules() TO batonq_reader;
GRANT EXECUTE ON FUNCTION
    batonq.enqueue_debounced(text, text, jsonb, double precision, double precision, text, integer, integer),
    batonq.due_schedules(integer),
    batonq.fire_schedule(text, timestamptz, timestamptz, timestamptz, timestamptz[], timestamptz)
TO batonq_worker;

INSERT INTO batonq.migrations (version, name) VALUES (13, 'flow');
