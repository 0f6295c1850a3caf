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
CREATE OR REPLACE FUNCTION batonq.due_schedules(p_limit integer DEFAULT 100) RETURNS SETOF batonq.due_schedule
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
CREATE OR REPLACE FUNCTION batonq.fire_schedule(
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
        BEGIN
            v_task := batonq.enqueue(v_schedule.queue, v_schedule.payload);
        EXCEPTION WHEN SQLSTATE 'BQ001' OR SQLSTATE 'BQ003' OR SQLSTATE 'BQ004' OR SQLSTATE 'BQ010'
                    OR SQLSTATE 'BQ011' THEN
            -- The queue refuses the payload (its max_body_bytes was lowered
            -- since, say): this tick is skipped, as if missed, and the
            -- schedule goes on (the firer logs the warning). An error here
            -- would undo the move to p_next_tick, and the schedule would come
            -- due again every round, ahead of every other.
            RAISE WARNING 'schedule % did not fire its tick of %: %', p_name, v_tick, SQLERRM;
            CONTINUE;
        END;
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
    batonq.due_schedules(integer),
    batonq.fire_schedule(text, timestamptz, timestamptz, timestamptz, timestamptz[], timestamptz)
TO batonq_worker;
