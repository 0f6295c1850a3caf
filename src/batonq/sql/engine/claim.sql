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
    ELSE
        PERFORM batonq._lease_ended(p_queue);  -- dead ones free a limit's room
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

-- The lock that a limited queue's claims (and a heartbeat taking up a lapsed
-- lease) queue on, held to the end of the transaction: what its holder
-- counts stays true until it has leased. Count in statements after taking
-- it, so they see what the lock's last holder committed.
CREATE OR REPLACE FUNCTION batonq._limits_lock(p_queue text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtext('batonq.limits'), hashtext(p_queue));
$$;

-- Whether one more task of p_group may be leased in p_queue: a heartbeat
-- that takes up a lease which ran out asks this (a claim counts for itself).
CREATE OR REPLACE FUNCTION batonq._room_for(p_queue text, p_group text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_queue batonq.queues;
BEGIN
    SELECT * INTO v_queue FROM batonq.queues WHERE name = p_queue;
    IF v_queue.max_leased IS NULL AND v_queue.group_max_leased IS NULL THEN
        RETURN true;
    END IF;
    PERFORM batonq._limits_lock(p_queue);
    RETURN (v_queue.max_leased IS NULL
            OR (SELECT count(*) FROM batonq.tasks
                 WHERE queue = p_queue AND state = 'leased') < v_queue.max_leased)
       AND (v_queue.group_max_leased IS NULL OR p_group IS NULL
            OR (SELECT count(*) FROM batonq.tasks
                 WHERE queue = p_queue AND state = 'leased' AND group_key = p_group)
               < v_queue.group_max_leased);
END $$;

-- A lease of p_queue ended (fail, cancel, expiry; complete looks with its
-- other settings): under a concurrency limit that frees room, so claimers
-- waiting on a full queue are woken (release and a retry due now wake
-- every queue's anyway).
CREATE OR REPLACE FUNCTION batonq._lease_ended(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM batonq.queues
                WHERE name = p_queue AND (max_leased IS NOT NULL OR group_max_leased IS NOT NULL)) THEN
        PERFORM batonq._wake(p_queue);
    END IF;
END $$;

-- The ids a group-limited claim takes, up to p_n: in claim order, skipping
-- the tasks of groups that are full (with their leases and the tasks taken
-- before in this claim), so one busy group does not hold the others back.
-- Tasks without a group count against the queue's limit only. The caller
-- holds the queue's limits lock; the walk reads the claim index and stops
-- once it has p_n (a cursor fetches as it goes), but reads past the tasks
-- of full groups that come first.
CREATE OR REPLACE FUNCTION batonq._pick_in_groups(p_queue batonq.queues, p_n integer) RETURNS bigint[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_leased jsonb;
    v_full   text[];
    v_ids    bigint[] := '{}';
    v_taken  integer;
    v_task   record;
BEGIN
    SELECT coalesce(jsonb_object_agg(g.group_key, g.n), '{}'),
           coalesce(array_agg(g.group_key) FILTER (WHERE g.n >= p_queue.group_max_leased), '{}')
      INTO v_leased, v_full
      FROM (SELECT group_key, count(*) AS n FROM batonq.tasks
             WHERE queue = p_queue.name AND state = 'leased' AND group_key IS NOT NULL
             GROUP BY group_key) g;
    FOR v_task IN
        SELECT id, group_key FROM batonq.tasks
         WHERE queue = p_queue.name AND state = 'pending' AND run_at <= now()
           AND (group_key IS NULL OR group_key <> ALL (v_full))
         ORDER BY priority DESC, run_at, id
    LOOP
        IF v_task.group_key IS NOT NULL THEN
            v_taken := coalesce((v_leased ->> v_task.group_key)::integer, 0);
            CONTINUE WHEN v_taken >= p_queue.group_max_leased;
            v_leased := jsonb_set(v_leased, ARRAY[v_task.group_key], to_jsonb(v_taken + 1));
        END IF;
        v_ids := v_ids || v_task.id;
        EXIT WHEN cardinality(v_ids) >= p_n;
    END LOOP;
    RETURN v_ids;
END $$;

-- Claim up to p_max_tasks claimable tasks of one queue: highest priority
-- first, then oldest run_at. Each claimed task gets a fresh fencing token and
-- lease secret and counts an attempt. A lease's "row" is the task's input
-- (its payload). p_key_id records the API key that asked (the service's),
-- so that key may later name the lease by task and fencing token alone.
--
-- A queue with limits (max_leased, group_max_leased, rate_limit) claims
-- one claimer at a time: its claims queue on the queue's limits lock, count
-- the leases held, take what room is left (skipping full groups) and as
-- many tokens of the rate bucket, so no claim ever exceeds a limit however
-- many claimers there are. Queues without limits take no lock.
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
    v_take    integer := p_max_tasks;  -- picked in claim order
    v_ids     bigint[] := '{}';        -- picked by the group walk
    v_now     timestamptz;
    v_tokens  double precision;
    v_count   integer;
    v_locked  boolean := false;
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
    IF v_queue.max_leased IS NOT NULL OR v_queue.group_max_leased IS NOT NULL
       OR v_queue.rate_limit IS NOT NULL THEN
        -- Looked at twice: first without the lock, so that the claimers a
        -- lease's end wakes on a full queue (or an empty bucket) do not
        -- queue on it only to find no room; then holding it. Room seen
        -- without the lock may be gone, never the other way round: the lock's
        -- holders only take room (the others give it back, and wake).
        LOOP
            v_take := p_max_tasks;
            IF v_queue.max_leased IS NOT NULL THEN
                v_take := least(v_take, v_queue.max_leased - (
                    SELECT count(*) FROM batonq.tasks WHERE queue = p_queue AND state = 'leased'));
            END IF;
            IF v_queue.rate_limit IS NOT NULL THEN
                -- The bucket holds up to rate_limit tokens and gains
                -- rate_limit per rate_period_s; the clock, not now(): this
                -- transaction may have begun before the lock's last holder
                -- refilled it.
                v_now := clock_timestamp();
                v_tokens := coalesce(
                    (SELECT least(v_queue.rate_limit,
                                  b.tokens + greatest(extract(epoch FROM v_now - b.at), 0)
                                             * v_queue.rate_limit / v_queue.rate_period_s)
                       FROM batonq.rate_buckets b WHERE b.queue = p_queue),
                    v_queue.rate_limit);
                v_take := least(v_take, floor(v_tokens)::integer);
            END IF;
            IF v_take <= 0 THEN
                RETURN;
            END IF;
            EXIT WHEN v_locked;
            PERFORM batonq._limits_lock(p_queue);
            v_locked := true;
        END LOOP;
        IF v_queue.group_max_leased IS NOT NULL THEN
            v_ids := batonq._pick_in_groups(v_queue, v_take);
            v_take := 0;
        END IF;
    END IF;
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT id FROM batonq.tasks
         WHERE queue = p_queue AND state = 'pending' AND run_at <= now()
         ORDER BY priority DESC, run_at, id
         LIMIT v_take
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
         WHERE t.queue = p_queue AND t.id = ANY (ARRAY(SELECT id FROM picked) || v_ids)
           AND t.state = 'pending'
        RETURNING t.*
    )
    SELECT c.id, c.queue, c.fencing_token,
           batonq._lease_token(c.queue, c.id, c.fencing_token, c.lease_secret),
           c.lease_expires_at, v_lease_s::double precision,
           c.attempts, c.max_attempts, c.priority, c.payload, c.idempotency_key,
           c.parent_id, c.root_id, c.created_at, c.run_at, c.group_key
      FROM claimed c
     ORDER BY c.priority DESC, c.run_at, c.id;
    IF v_tokens IS NOT NULL THEN
        GET DIAGNOSTICS v_count = ROW_COUNT;
        INSERT INTO batonq.rate_buckets AS b (queue, tokens, at)
        VALUES (p_queue, v_tokens - v_count, v_now)
        ON CONFLICT (queue) DO UPDATE SET tokens = excluded.tokens, at = excluded.at;
    END IF;
END $$;

-- Seconds until p_queue's rate bucket holds a token: 0 when it holds one
-- now or the queue has no rate limit. A claimer that found nothing sleeps
-- this long (at most) instead of polling an empty bucket.
CREATE OR REPLACE FUNCTION batonq.rate_wait_s(p_queue text) RETURNS double precision
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT coalesce(max(greatest(0,
               (1 - b.tokens - greatest(extract(epoch FROM clock_timestamp() - b.at), 0)
                               * q.rate_limit / q.rate_period_s)
               * q.rate_period_s / q.rate_limit)), 0)::double precision
      FROM batonq.queues q JOIN batonq.rate_buckets b ON b.queue = q.name
     WHERE q.name = p_queue AND q.rate_limit IS NOT NULL;
END;

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
GRANT EXECUTE ON FUNCTION batonq.rate_wait_s(text) TO batonq_reader;
