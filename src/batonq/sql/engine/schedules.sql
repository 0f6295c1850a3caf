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
