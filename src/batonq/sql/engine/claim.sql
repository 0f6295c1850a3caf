-- batonq engine: claim, lease expiry and the sweep.

-- Statements that find rows by id (id = ANY (...)) test a state as
-- "NOT IN (the other states)", never as "state = 'x'": the latter would let
-- the planner read a partial index of that state (the claim index, the
-- lease index) by queue with the ids as a filter, the whole queue's backlog
-- on every call; with no statistics (a new database, a bulk load not yet
-- analyzed) it does. The states are those of batonq.tasks' CHECK.

-- Return the expired leases of one queue: to pending while attempts remain
-- (keeping the old fencing token, so the old holder may still finish if
-- nobody claims it first), else to the archive as dead. Every statement names
-- the queue, so it reads one partition; the rows it picked are found again
-- by the primary key (the state test above).
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
         WHERE t.queue = p_queue AND t.id = ANY (v_ids) AND t.state NOT IN ('waiting', 'held', 'pending')
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
    PERFORM batonq._fold_group_leases(p_queue);
    RETURN (v_queue.max_leased IS NULL
            OR (SELECT count(*) FROM batonq.tasks
                 WHERE queue = p_queue AND state = 'leased') < v_queue.max_leased)
       AND (v_queue.group_max_leased IS NULL OR p_group IS NULL
            OR coalesce((SELECT g.leased FROM batonq.group_leases g
                          WHERE g.queue = p_queue AND g.group_key = p_group), 0)
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

-- The tokens a bucket holds at p_now that held p_tokens at p_at: it gains
-- p_limit per p_period_s, up to p_limit.
CREATE OR REPLACE FUNCTION batonq._bucket_tokens(
    p_tokens double precision, p_at timestamptz, p_now timestamptz,
    p_limit integer, p_period_s double precision
) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN least(p_limit, p_tokens + greatest(extract(epoch FROM p_now - p_at), 0) * p_limit / p_period_s);

-- Keeps batonq.group_leases (migrations/0009): a grouped task that becomes
-- leased or stops being leased (claim, heartbeat taking up a lapsed lease,
-- complete, fail, release, expiry, cancel, whatever the path) adds a delta
-- row. Row triggers whose WHEN skips every other change, so tasks without a
-- group, and heartbeats, pay nothing.
CREATE OR REPLACE FUNCTION batonq._count_group_lease() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state = 'leased' AND OLD.group_key IS NOT NULL THEN
        INSERT INTO batonq.group_lease_deltas (queue, group_key, n) VALUES (OLD.queue, OLD.group_key, -1);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND NEW.state = 'leased' AND NEW.group_key IS NOT NULL THEN
        INSERT INTO batonq.group_lease_deltas (queue, group_key, n) VALUES (NEW.queue, NEW.group_key, 1);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER tasks_group_lease_insert AFTER INSERT ON batonq.tasks
    FOR EACH ROW WHEN (NEW.state = 'leased' AND NEW.group_key IS NOT NULL)
    EXECUTE FUNCTION batonq._count_group_lease();

CREATE OR REPLACE TRIGGER tasks_group_lease_update AFTER UPDATE ON batonq.tasks
    FOR EACH ROW WHEN ((OLD.state = 'leased' AND OLD.group_key IS NOT NULL
                        OR NEW.state = 'leased' AND NEW.group_key IS NOT NULL)
                       AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.group_key IS DISTINCT FROM NEW.group_key
                            OR OLD.queue IS DISTINCT FROM NEW.queue))
    EXECUTE FUNCTION batonq._count_group_lease();

CREATE OR REPLACE TRIGGER tasks_group_lease_delete AFTER DELETE ON batonq.tasks
    FOR EACH ROW WHEN (OLD.state = 'leased' AND OLD.group_key IS NOT NULL)
    EXECUTE FUNCTION batonq._count_group_lease();

-- Fold p_queue's delta rows into batonq.group_leases: called holding the
-- queue's limits lock, so the counts are exact for its holder (every lease
-- taken or ended before is committed and its delta visible). Reads the
-- deltas since the last fold, about the leases taken and ended since.
-- A group a lease ended in gets back its best set-aside (group_full) tasks,
-- as many as it has room for: no better task of it is left out of the claim
-- index, so a claim still takes each group's tasks in claim order.
CREATE OR REPLACE FUNCTION batonq._fold_group_leases(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_emptied text[];
    v_freed   text[];
BEGIN
    WITH gone AS (
        DELETE FROM batonq.group_lease_deltas d WHERE d.queue = p_queue RETURNING d.group_key, d.n
    ), sums AS (
        SELECT gone.group_key, sum(gone.n) AS n, bool_or(gone.n < 0) AS ended
          FROM gone GROUP BY gone.group_key
    ), folded AS (
        -- In group order, as every fold: two folds wait on each other in
        -- the same order.
        INSERT INTO batonq.group_leases AS g (queue, group_key, leased)
        SELECT p_queue, sums.group_key, sums.n FROM sums ORDER BY sums.group_key
        ON CONFLICT (queue, group_key) DO UPDATE SET leased = g.leased + excluded.leased
        RETURNING g.group_key, g.leased
    )
    SELECT (SELECT array_agg(f.group_key) FROM folded f WHERE f.leased = 0),
           (SELECT array_agg(s.group_key) FROM sums s WHERE s.ended)
      INTO v_emptied, v_freed;
    IF v_emptied IS NOT NULL THEN
        DELETE FROM batonq.group_leases g
         WHERE g.queue = p_queue AND g.group_key = ANY (v_emptied) AND g.leased = 0;
    END IF;
    IF v_freed IS NOT NULL THEN
        -- By the primary key: a t.group_full here would let the planner
        -- read every set-aside task of the queue by its index instead.
        UPDATE batonq.tasks t SET group_full = false
         WHERE t.queue = p_queue AND t.id = ANY (ARRAY(
            SELECT b.id
              FROM unnest(v_freed) AS f(group_key),
                   LATERAL (SELECT p.id FROM batonq.tasks p
                             WHERE p.queue = p_queue AND p.group_key = f.group_key AND p.group_full
                             ORDER BY p.priority DESC, p.run_at, p.id
                             LIMIT greatest((SELECT q.group_max_leased FROM batonq.queues q WHERE q.name = p_queue)
                                            - coalesce((SELECT g.leased FROM batonq.group_leases g
                                                         WHERE g.queue = p_queue AND g.group_key = f.group_key), 0),
                                            0)) b));
    END IF;
END $$;

-- What clears group_full: any change of the task's state (held, leased
-- by a heartbeat taking up its lapsed lease, ...). Only the fold above and
-- a change of group_max_leased clear it on a task still pending.
CREATE OR REPLACE FUNCTION batonq._group_full_cleared() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.group_full := false;
    RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER tasks_group_full_cleared BEFORE UPDATE ON batonq.tasks
    FOR EACH ROW WHEN (OLD.group_full AND NEW.group_full AND NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION batonq._group_full_cleared();

-- The ids a group-limited claim takes, up to p_n: in claim order, skipping
-- the tasks of groups that are full (group_max_leased: with their leases
-- and the tasks taken before in this claim) or out of tokens
-- (group_rate_limit: a token per task taken), so one busy group does not
-- hold the others back. Tasks without a group count against the queue's
-- limits only. The caller holds the queue's limits lock (and takes the
-- tokens once it has leased). The walk reads the claim index in order; each
-- grouped task's lease count and rate bucket are read by key (scalar
-- subqueries: a join could read every group's row). It stops once it has
-- p_n (a cursor fetches as it goes). The tasks it read past because their
-- group was full before this claim are set aside (group_full): out of the
-- claim index until a lease of their group ends (_fold_group_leases), so
-- each is read past once, however many claims come while its group is full.
-- (Not the tasks of a group this claim fills: a task it picked may turn out
-- held or cancelled, and no lease would end to give them back.)
CREATE OR REPLACE FUNCTION batonq._pick_in_groups(p_queue batonq.queues, p_n integer) RETURNS bigint[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan
SET cursor_tuple_fraction = 0.001 AS $$
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_took   jsonb := '{}';     -- how many of each group met this claim took
    v_taken  integer;
    v_ids    bigint[] := '{}';
    v_full   bigint[] := '{}';
    -- Read under the lock: a change of the limit gives every set-aside task
    -- back under the same lock, so none is set aside by the old one after.
    v_max    integer := (SELECT q.group_max_leased FROM batonq.queues q WHERE q.name = p_queue.name);
    v_task   record;
    -- A declared cursor is planned to fetch a few rows first, and the
    -- fraction makes that few: planned for all of them, the walk would sort
    -- the queue's backlog instead of reading the claim index in order.
    v_walk   CURSOR FOR
        SELECT t.id, t.group_key, r.leased, r.spent
          FROM batonq.tasks t
         CROSS JOIN LATERAL (
            SELECT CASE WHEN t.group_key IS NOT NULL AND v_max IS NOT NULL THEN
                        coalesce((SELECT g.leased FROM batonq.group_leases g
                                   WHERE g.queue = p_queue.name AND g.group_key = t.group_key), 0)
                   END AS leased,
                   -- The bucket's tokens taken (a bucket not there is full).
                   CASE WHEN t.group_key IS NOT NULL AND p_queue.group_rate_limit IS NOT NULL THEN
                        coalesce((SELECT ceil(greatest(extract(epoch FROM b.full_at - v_now), 0)
                                              * p_queue.group_rate_limit / p_queue.rate_period_s)::integer
                                    FROM batonq.group_rate_buckets b
                                   WHERE b.queue = p_queue.name AND b.group_key = t.group_key), 0)
                   END AS spent
            OFFSET 0) r
         WHERE t.queue = p_queue.name AND t.state = 'pending' AND NOT t.group_full AND t.run_at <= now()
           AND (r.spent IS NULL OR r.spent < p_queue.group_rate_limit)
         ORDER BY t.priority DESC, t.run_at, t.id;
BEGIN
    PERFORM batonq._fold_group_leases(p_queue.name);
    FOR v_task IN v_walk LOOP
        IF v_task.group_key IS NOT NULL THEN
            IF v_task.leased >= v_max THEN  -- full before this claim (NULL: no limit)
                v_full := v_full || v_task.id;
                CONTINUE;
            END IF;
            v_taken := coalesce((v_took ->> v_task.group_key)::integer, 0);
            -- Room under group_max_leased and the bucket's whole tokens (a
            -- comparison with a limit not set is NULL: no skip).
            CONTINUE WHEN v_task.leased + v_taken >= v_max
                       OR v_task.spent + v_taken >= p_queue.group_rate_limit;
            v_took := jsonb_set(v_took, ARRAY[v_task.group_key], to_jsonb(v_taken + 1));
        END IF;
        v_ids := v_ids || v_task.id;
        EXIT WHEN cardinality(v_ids) >= p_n;
    END LOOP;
    IF cardinality(v_full) > 0 THEN
        UPDATE batonq.tasks t SET group_full = true
         WHERE t.queue = p_queue.name AND t.id = ANY (v_full) AND t.state = 'pending';
    END IF;
    RETURN v_ids;
END $$;

-- Claim up to p_max_tasks claimable tasks of one queue: highest priority
-- first, then oldest run_at. Each claimed task gets a fresh fencing token and
-- lease secret and counts an attempt. A lease's "row" is the task's input
-- (its payload). p_key_id records the API key that asked (the service's),
-- so that key may later name the lease by task and fencing token alone.
--
-- A queue with limits (max_leased, group_max_leased, rate_limit,
-- group_rate_limit) claims one claimer at a time: its claims queue on the
-- queue's limits lock, count the leases held, take what room is left
-- (skipping full groups and those with an empty bucket) and as many tokens
-- of the rate buckets, so no claim ever exceeds a limit however
-- many claimers there are. Queues without limits take no lock.
--
-- Written for generic plans (PL/pgSQL caches them): the queue is named on
-- every reference to the partitioned table, so the planner prunes to one
-- partition, and the ids are picked in a MATERIALIZED CTE and matched with
-- = ANY(ARRAY(...)), which never over-fetches (a semi-join on a SKIP LOCKED
-- subquery may be re-evaluated and claim more than asked) and never turns
-- into a hash join over the whole table; the ids are looked up by the
-- primary key alone (the state test above expire_leases says why), so a
-- claim reads its batch whether or not the table was ever analyzed.
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
       OR v_queue.rate_limit IS NOT NULL OR v_queue.group_rate_limit IS NOT NULL THEN
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
                    (SELECT batonq._bucket_tokens(b.tokens, b.at, v_now, v_queue.rate_limit,
                                                  v_queue.rate_period_s)
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
        IF v_queue.group_max_leased IS NOT NULL OR v_queue.group_rate_limit IS NOT NULL THEN
            v_ids := batonq._pick_in_groups(v_queue, v_take);
            v_take := 0;
        END IF;
    END IF;
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT id FROM batonq.tasks
         WHERE queue = p_queue AND state = 'pending' AND NOT group_full AND run_at <= now()
         ORDER BY priority DESC, run_at, id
         LIMIT v_take
           FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE batonq.tasks t SET
            state = 'leased',
            attempts = t.attempts + 1,
            -- Above the task's last token even if the sequence is behind
            -- it (restored, or one of a node's ranges under Citus:
            -- docs/scaling.md): a stale holder's token is always smaller.
            fencing_token = greatest(nextval('batonq.fencing_seq'), t.fencing_token + 1),
            lease_secret = gen_random_uuid(),
            lease_s = v_lease_s,
            lease_expires_at = now() + make_interval(secs => v_lease_s),
            claimed_at = now(),
            worker = p_worker,
            claim_key = p_key_id,
            stage = NULL
         WHERE t.queue = p_queue AND t.id = ANY (ARRAY(SELECT id FROM picked) || v_ids)
           AND t.state NOT IN ('waiting', 'held', 'leased')
        RETURNING t.*
    )
    SELECT c.id, c.queue, c.fencing_token,
           batonq._lease_token(c.queue, c.id, c.fencing_token, c.lease_secret),
           c.lease_expires_at, v_lease_s::double precision,
           c.attempts, c.max_attempts, c.priority, c.payload, c.idempotency_key,
           c.parent_id, c.root_id, c.created_at, c.run_at, c.group_key, c.trace_context
      FROM claimed c
     ORDER BY c.priority DESC, c.run_at, c.id;
    IF v_tokens IS NOT NULL THEN
        GET DIAGNOSTICS v_count = ROW_COUNT;
        INSERT INTO batonq.rate_buckets AS b (queue, tokens, at)
        VALUES (p_queue, v_tokens - v_count, v_now)
        ON CONFLICT (queue) DO UPDATE SET tokens = excluded.tokens, at = excluded.at;
    END IF;
    -- Each group claimed from gives a token per task: its bucket is full
    -- again rate_period_s / group_rate_limit later per token (from now, if
    -- it was full). The walk's picks that were leased are this claim's:
    -- only the lock's holder leases them.
    IF v_queue.group_rate_limit IS NOT NULL AND cardinality(v_ids) > 0 THEN
        v_now := clock_timestamp();
        INSERT INTO batonq.group_rate_buckets AS b (queue, group_key, full_at)
        SELECT p_queue, t.group_key,
               v_now + make_interval(secs => count(*) * v_queue.rate_period_s / v_queue.group_rate_limit)
          FROM batonq.tasks t
         WHERE t.queue = p_queue AND t.id = ANY (v_ids) AND t.state NOT IN ('waiting', 'held', 'pending')
           AND t.group_key IS NOT NULL
         GROUP BY t.group_key
        ON CONFLICT (queue, group_key) DO UPDATE SET
            full_at = excluded.full_at + greatest(b.full_at - v_now, interval '0');
    END IF;
END $$;

-- Seconds until a claim of p_queue may find a token: the queue's rate
-- bucket's wait when it is empty, else the soonest token of the group
-- buckets that are empty while their group has tasks due (the claim skipped
-- those); 0 when nothing waits on a token or the queue has no rate limits.
-- A claimer that found nothing sleeps this long (at most) instead of
-- polling an empty bucket. The group look reads the queue's empty buckets
-- by index and, for each, the claim index until a due task of its group.
-- A bucket whose token came due less than 0.2 s ago still counts as empty,
-- with a wait of 1 ms: the claim that found it empty ran a moment before
-- this look (a round trip earlier, through a pooler), and a 0 would send
-- its claimer to sleep for its whole idle wait with a token ready.
CREATE OR REPLACE FUNCTION batonq.rate_wait_s(p_queue text) RETURNS double precision
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT coalesce((SELECT CASE WHEN w.s > -0.2 THEN greatest(w.s, 0.001) ELSE 0 END
      FROM batonq.queues q,
           LATERAL (SELECT greatest(
               -- (The queue's bucket short of a token when last taken from:
               -- its next token's time, uncapped, so a token long due is
               -- far below -0.2 s.)
               coalesce((SELECT (1 - b.tokens) * q.rate_period_s / q.rate_limit
                                - extract(epoch FROM clock_timestamp() - b.at)
                           FROM batonq.rate_buckets b
                          WHERE b.queue = q.name AND q.rate_limit IS NOT NULL AND b.tokens < 1), -1),
               -- A group's bucket holds a token again once it is full within
               -- group_rate_limit - 1 tokens' time.
               coalesce((SELECT extract(epoch FROM min(g.full_at) - clock_timestamp())
                                - (q.group_rate_limit - 1) * q.rate_period_s / q.group_rate_limit
                           FROM batonq.group_rate_buckets g
                          WHERE g.queue = q.name AND q.group_rate_limit IS NOT NULL
                            AND g.full_at > clock_timestamp() + make_interval(
                                    secs => (q.group_rate_limit - 1) * q.rate_period_s / q.group_rate_limit - 0.2)
                            AND EXISTS (SELECT FROM batonq.tasks t
                                         WHERE t.queue = q.name AND t.state = 'pending' AND NOT t.group_full
                                           AND t.run_at <= now() AND t.group_key = g.group_key)), -1)) AS s) w
     WHERE q.name = p_queue), 0)::double precision;
END;

-- Expire the leases of every queue that has expired ones: for queues nobody
-- is claiming from. Returns how many tasks it touched. Also folds the group
-- lease counts of every queue (under its limits lock), so the deltas of
-- queues that no group-limited claim folds do not pile up.
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
    FOR v_queue IN SELECT DISTINCT d.queue FROM batonq.group_lease_deltas d LOOP
        PERFORM batonq._limits_lock(v_queue);
        PERFORM batonq._fold_group_leases(v_queue);
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
