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
