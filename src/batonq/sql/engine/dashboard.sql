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
