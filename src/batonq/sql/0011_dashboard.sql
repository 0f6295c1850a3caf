-- batonq 0011: the reads behind the dashboard (batonq serve, /ui).
--
-- Queue scopes arrive as anchored POSIX regular expressions (the callers
-- translate a key's glob patterns), so a page of queues is cut after the
-- key's scopes are applied and a narrow key still gets full pages.

-- Dead tasks across queues, newest first. Partial: only dead rows pay for
-- it, and the dead-letter page reads it from its left edge.
CREATE INDEX archive_dead_idx ON batonq.archive (id DESC) WHERE state = 'dead';

-- A page of queues (by name, after p_after), with their counts: those whose
-- name matches one of p_scopes and contains p_search.
CREATE FUNCTION batonq.queue_page(
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
CREATE FUNCTION batonq.queue_count(p_scopes text[], p_search text DEFAULT NULL) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT count(*) FROM batonq.queues q
     WHERE q.name ~ ANY (p_scopes) AND strpos(q.name, lower(coalesce(p_search, ''))) > 0;
END;

-- Finishes per queue and minute over the last p_minutes minutes (the
-- current minute included), for the queues named. Reads only the archive
-- partitions of those minutes.
CREATE FUNCTION batonq.throughput(p_queues text[], p_minutes integer DEFAULT 15)
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
CREATE FUNCTION batonq.find_tasks(
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
           AND (p_worker IS NULL OR v.worker = p_worker) AND (p_state IS NULL OR v.state = p_state);
        RETURN;
    END IF;
    -- By worker: the queue's rows newest first, filtered (no index by worker).
    RETURN QUERY
    SELECT v.* FROM (
        (SELECT (batonq._hot_view(t)).* FROM batonq.tasks t
          WHERE t.queue = p_queue AND t.id < v_before AND t.worker = p_worker
            AND (p_state IS NULL OR t.state = p_state)
          ORDER BY t.id DESC LIMIT v_limit)
        UNION ALL
        (SELECT (batonq._archive_view(a)).* FROM batonq.archive a
          WHERE a.queue = p_queue AND a.id < v_before AND a.worker = p_worker
            AND (p_state IS NULL OR a.state = p_state)
          ORDER BY a.id DESC LIMIT v_limit)
    ) v
    ORDER BY v.id DESC LIMIT v_limit;
END $$;

-- Dead tasks across the queues in scope, newest first: optionally of one
-- queue, or with p_error in their last error.
CREATE FUNCTION batonq.dead_tasks(
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

-- The writes about a task that were refused and set aside in the submit
-- ledger: the lease (fencing token) they came under, what, when.
CREATE FUNCTION batonq.late_writes(p_task_id bigint)
RETURNS TABLE (fencing_token bigint, kind text, state_after text, body jsonb, at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT s.fencing_token, s.kind, s.state_after, s.body, s.at FROM batonq.submits s
     WHERE s.task_id = p_task_id AND s.outcome = 'set_aside'
     ORDER BY s.at, s.fencing_token;
END;

-- Per worker name, over the last p_since_s seconds, on the queues in
-- scope. A task records only its last holder's name, so each count goes to
-- the worker that held the task's newest lease: tasks done and dead,
-- failed attempts (lease expiries included) under that lease, refused late
-- writes under it; the median is of claim-to-finish times of done tasks.
-- Late writes under an older lease, whose holder is not recorded, are
-- counted under a NULL worker.
CREATE FUNCTION batonq.worker_scorecards(p_scopes text[], p_since_s double precision DEFAULT 86400)
RETURNS TABLE (worker text, done bigint, failed bigint, dead bigint, late_writes bigint,
               median_s double precision, last_seen timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    WITH held AS (
        SELECT t.id, t.worker, t.fencing_token, NULL::text AS state, t.errors,
               NULL::double precision AS took_s, t.claimed_at AS seen
          FROM batonq.tasks t
         WHERE t.worker IS NOT NULL AND t.queue ~ ANY (p_scopes)
           AND t.claimed_at >= now() - make_interval(secs => p_since_s)
        UNION ALL
        SELECT a.id, a.worker, a.fencing_token, a.state, a.errors,
               extract(epoch FROM a.finished_at - a.claimed_at)::double precision, a.finished_at
          FROM batonq.archive a
         WHERE a.worker IS NOT NULL AND a.queue ~ ANY (p_scopes)
           AND a.finished_at >= now() - make_interval(secs => p_since_s)
    ), late AS (
        SELECT h.worker, count(*) AS n
          FROM batonq.submits s
          LEFT JOIN held h ON h.id = s.task_id AND h.fencing_token = s.fencing_token
         WHERE s.outcome = 'set_aside' AND s.queue ~ ANY (p_scopes)
           AND s.at >= now() - make_interval(secs => p_since_s)
         GROUP BY h.worker
    ), cards AS (
        SELECT h.worker,
               count(*) FILTER (WHERE h.state = 'done') AS done,
               sum((SELECT count(*) FROM jsonb_array_elements(h.errors) e
                     WHERE (e ->> 'fencing_token')::bigint = h.fencing_token)) AS failed,
               count(*) FILTER (WHERE h.state = 'dead') AS dead,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY h.took_s)
                   FILTER (WHERE h.state = 'done') AS median_s,
               max(h.seen) AS last_seen
          FROM held h GROUP BY h.worker
    )
    -- GROUP BY puts the unattributed late writes (NULL) in one row.
    SELECT w.worker, sum(w.done)::bigint, sum(w.failed)::bigint, sum(w.dead)::bigint,
           sum(w.late_writes)::bigint, max(w.median_s), max(w.last_seen)
      FROM (SELECT c.worker, c.done, c.failed, c.dead, 0 AS late_writes, c.median_s, c.last_seen
              FROM cards c
            UNION ALL
            SELECT l.worker, 0, 0, 0, l.n, NULL, NULL FROM late l) w
     GROUP BY w.worker
     ORDER BY w.worker NULLS LAST;
END;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    batonq.queue_page(text[], text, text, integer),
    batonq.queue_count(text[], text),
    batonq.throughput(text[], integer),
    batonq.find_tasks(text, text, text, text, integer, bigint),
    batonq.dead_tasks(text[], text, text, integer, bigint),
    batonq.late_writes(bigint),
    batonq.worker_scorecards(text[], double precision)
TO batonq_reader;

INSERT INTO batonq.migrations (version, name) VALUES (11, 'dashboard');
