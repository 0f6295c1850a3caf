-- batonq engine: claim, lease expiry and the sweep.

-- Return the expired leases of one queue: to pending while attempts remain
-- (keeping the old fencing token, so the old holder may still finish if
-- nobody claims it first), else to the archive as dead. Every statement names
-- the queue, so it reads one partition's small partial index.
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
    END IF;
    WITH dead AS (
        DELETE FROM batonq.tasks t
         WHERE t.queue = p_queue AND t.id = ANY (v_ids) AND t.state = 'leased'
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

-- Claim up to p_max_tasks claimable tasks of one queue: highest priority
-- first, then oldest run_at. Each claimed task gets a fresh fencing token and
-- lease secret and counts an attempt. A lease's "row" is the task's input
-- (its payload). p_key_id records the API key that asked (the service's),
-- so that key may later name the lease by task and fencing token alone.
--
-- Written for generic plans (PL/pgSQL caches them): the queue is named on
-- every reference to the partitioned table, so the planner prunes to one
-- partition, and the ids are picked in a MATERIALIZED CTE and matched with
-- = ANY(ARRAY(...)), which never over-fetches (a semi-join on a SKIP LOCKED
-- subquery may be re-evaluated and claim more than asked) and never turns
-- into a hash join over the whole table.
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
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT id FROM batonq.tasks
         WHERE queue = p_queue AND state = 'pending' AND run_at <= now()
         ORDER BY priority DESC, run_at, id
         LIMIT p_max_tasks
           FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE batonq.tasks t SET
            state = 'leased',
            attempts = t.attempts + 1,
            fencing_token = nextval('batonq.fencing_seq'),
            lease_secret = gen_random_uuid(),
            lease_s = v_lease_s,
            lease_expires_at = now() + make_interval(secs => v_lease_s),
            claimed_at = now(),
            worker = p_worker,
            claim_key = p_key_id,
            stage = NULL
         WHERE t.queue = p_queue AND t.id = ANY (ARRAY(SELECT id FROM picked))
        RETURNING t.*
    )
    SELECT c.id, c.queue, c.fencing_token,
           batonq._lease_token(c.queue, c.id, c.fencing_token, c.lease_secret),
           c.lease_expires_at, v_lease_s::double precision,
           c.attempts, c.max_attempts, c.priority, c.payload, c.idempotency_key,
           c.parent_id, c.root_id, c.created_at, c.run_at
      FROM claimed c
     ORDER BY c.priority DESC, c.run_at, c.id;
END $$;

-- Expire the leases of every queue that has expired ones: for queues nobody
-- is claiming from. Returns how many tasks it touched.
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
