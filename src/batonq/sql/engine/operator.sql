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
