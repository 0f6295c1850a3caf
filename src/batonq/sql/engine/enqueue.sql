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
