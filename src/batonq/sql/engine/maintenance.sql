-- batonq engine: archive partitions and retention.

-- Make the daily partitions of batonq.archive and batonq.submits (UTC days)
-- from p_from for p_days days. A day whose rows already sit in the default
-- partition is skipped: those rows stay there until retention deletes them.
CREATE OR REPLACE FUNCTION batonq.ensure_partitions(p_from date DEFAULT NULL, p_days integer DEFAULT 4)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_from    date := coalesce(p_from, (now() AT TIME ZONE 'UTC')::date - 1);
    v_day     date;
    v_table   text;
    v_name    text;
    v_created integer := 0;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['archive', 'submits'] LOOP
        FOR i IN 0..p_days - 1 LOOP
            v_day := v_from + i;
            v_name := v_table || '_' || to_char(v_day, 'YYYYMMDD');
            CONTINUE WHEN to_regclass('batonq.' || v_name) IS NOT NULL;
            BEGIN
                EXECUTE format('CREATE TABLE batonq.%I PARTITION OF batonq.%I FOR VALUES FROM (%L) TO (%L)',
                               v_name, v_table,
                               v_day::timestamp AT TIME ZONE 'UTC',
                               (v_day + 1)::timestamp AT TIME ZONE 'UTC');
                -- As on every batonq table (migration 0010): no rows for other roles.
                EXECUTE format('ALTER TABLE batonq.%I ENABLE ROW LEVEL SECURITY', v_name);
                v_created := v_created + 1;
            EXCEPTION WHEN check_violation OR duplicate_table THEN
                NULL;
            END;
        END LOOP;
    END LOOP;
    RETURN v_created;
END $$;

-- Retention: finished tasks older than their queue's retention_s go, with
-- their submit records and idempotency keys, debounce windows whose task
-- has finished, the group rate buckets that are full again, and expired
-- dashboard sessions. Whole day
-- partitions older than the longest retention are dropped; queues that keep
-- less lose their older rows by DELETE, p_batch at a time. Returns what it
-- removed.
--
-- A finished fan-out element stays while its join has not gathered (the
-- join waits, or is dead or cancelled and may be retried): the gather reads
-- the elements' results from the archive. A day partition that holds such
-- an element is not dropped; its other rows go row by row. A join's row in
-- batonq.joins goes with its join task.
CREATE OR REPLACE FUNCTION batonq.run_retention(p_batch integer DEFAULT 10000) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_keep_s     integer := coalesce((SELECT max(retention_s) FROM batonq.queues), 604800);
    v_cutoff     date := ((now() - make_interval(secs => v_keep_s)) AT TIME ZONE 'UTC')::date;
    v_part       record;
    v_needed     boolean;
    v_dropped    integer := 0;
    v_rows       integer := 0;
    v_keys       integer := 0;
    v_debounces  integer := 0;
    v_buckets    integer := 0;
    v_sessions   integer := 0;
BEGIN
    FOR v_part IN
        SELECT c.relname
          FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent IN ('batonq.archive'::regclass, 'batonq.submits'::regclass)
           AND c.relname ~ '_[0-9]{8}$'
           AND to_date(right(c.relname, 8), 'YYYYMMDD') < v_cutoff
    LOOP
        IF v_part.relname LIKE 'archive\_%' THEN
            EXECUTE format('SELECT EXISTS (SELECT FROM batonq.%I a JOIN batonq.joins j
                                             ON j.join_task_id = a.join_task_id AND NOT j.resolved)',
                           v_part.relname)
               INTO v_needed;
            CONTINUE WHEN v_needed;
            EXECUTE format('DELETE FROM batonq.joins j USING batonq.%I a WHERE j.join_task_id = a.id',
                           v_part.relname);
        END IF;
        -- Dropping a partition fires no trigger: take its tasks off the counts.
        IF v_part.relname LIKE 'archive\_%' THEN
            EXECUTE format('INSERT INTO batonq.finished_counts (queue, state, n)
                            SELECT queue, state, -count(*) FROM batonq.%I GROUP BY queue, state',
                           v_part.relname);
        END IF;
        EXECUTE format('DROP TABLE batonq.%I', v_part.relname);
        v_dropped := v_dropped + 1;
    END LOOP;

    WITH old AS (
        SELECT a.id, a.finished_at FROM batonq.archive a JOIN batonq.queues q ON q.name = a.queue
         WHERE a.finished_at < now() - make_interval(secs => q.retention_s)
           AND NOT EXISTS (SELECT FROM batonq.joins j
                            WHERE j.join_task_id = a.join_task_id AND NOT j.resolved)
         LIMIT p_batch
    ), gone AS (
        DELETE FROM batonq.archive a USING old
         WHERE a.id = old.id AND a.finished_at = old.finished_at
        RETURNING a.id
    ), joins_gone AS (
        DELETE FROM batonq.joins j USING gone WHERE j.join_task_id = gone.id
    )
    SELECT count(*) INTO v_rows FROM gone;

    DELETE FROM batonq.submits s
     WHERE s.ctid = ANY (ARRAY(
        SELECT s2.ctid FROM batonq.submits s2 JOIN batonq.queues q ON q.name = s2.queue
         WHERE s2.at < now() - make_interval(secs => q.retention_s)
         LIMIT p_batch));

    -- A key is kept while its task is: in the hot table, or in the archive.
    WITH old AS (
        SELECT k.queue, k.key FROM batonq.idempotency_keys k JOIN batonq.queues q ON q.name = k.queue
         WHERE k.created_at < now() - make_interval(secs => q.retention_s)
           AND NOT EXISTS (SELECT FROM batonq.tasks t WHERE t.queue = k.queue AND t.id = k.task_id)
           AND NOT EXISTS (SELECT FROM batonq.archive a WHERE a.id = k.task_id)
         LIMIT p_batch
    )
    DELETE FROM batonq.idempotency_keys k USING old WHERE k.queue = old.queue AND k.key = old.key;
    GET DIAGNOSTICS v_keys = ROW_COUNT;

    -- A baton's identity is kept while the task it came from is.
    DELETE FROM batonq.batons b
     WHERE b.ctid = ANY (ARRAY(
        SELECT b2.ctid FROM batonq.batons b2
         WHERE b2.created_at < now() - make_interval(secs => v_keep_s)
           AND NOT EXISTS (SELECT FROM batonq.archive a WHERE a.id = b2.parent_id)
         LIMIT p_batch));

    -- A debounce window is open while its task waits in the hot table; once
    -- the task has left it (finished), the key's next enqueue opens a new
    -- window anyway, so the row is dead weight. The delete matches the row's
    -- task_id as read: an enqueue that reopened the window meanwhile (a new
    -- task_id) keeps its row.
    WITH old AS (
        SELECT d.queue, d.key, d.task_id FROM batonq.debounces d
         WHERE NOT EXISTS (SELECT FROM batonq.tasks t WHERE t.queue = d.queue AND t.id = d.task_id)
         LIMIT p_batch
    )
    DELETE FROM batonq.debounces d USING old
     WHERE d.queue = old.queue AND d.key = old.key AND d.task_id = old.task_id;
    GET DIAGNOSTICS v_debounces = ROW_COUNT;

    -- A group's rate bucket that is full again (full_at passed) is as good
    -- as none: the row goes (all of a queue's, once it has no group rate).
    -- The delete matches the row's full_at as read: a claim that took a
    -- token meanwhile moved it, and keeps its row.
    WITH idle AS (
        SELECT b.queue, b.group_key, b.full_at FROM batonq.group_rate_buckets b
          LEFT JOIN batonq.queues q ON q.name = b.queue
         WHERE q.group_rate_limit IS NULL OR b.full_at <= now()
         LIMIT p_batch
    )
    DELETE FROM batonq.group_rate_buckets b USING idle
     WHERE b.queue = idle.queue AND b.group_key = idle.group_key AND b.full_at = idle.full_at;
    GET DIAGNOSTICS v_buckets = ROW_COUNT;

    -- An expired session signs nobody in (session_for_auth): the row goes.
    DELETE FROM batonq.dashboard_sessions s
     WHERE s.token_hash = ANY (ARRAY(
        SELECT s2.token_hash FROM batonq.dashboard_sessions s2 WHERE s2.expires_at <= now() LIMIT p_batch));
    GET DIAGNOSTICS v_sessions = ROW_COUNT;

    -- behind: a full batch was removed, so more may be due now.
    RETURN jsonb_build_object('partitions_dropped', v_dropped, 'archived_deleted', v_rows,
                              'keys_deleted', v_keys, 'debounces_deleted', v_debounces,
                              'rate_buckets_deleted', v_buckets, 'sessions_deleted', v_sessions,
                              'behind', v_rows = p_batch OR v_keys = p_batch OR v_debounces = p_batch
                                        OR v_buckets = p_batch OR v_sessions = p_batch);
END $$;

-- What the sweeper runs every minute or so.
CREATE OR REPLACE FUNCTION batonq.maintain() RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_report jsonb := jsonb_build_object('partitions_created', batonq.ensure_partitions())
                      || batonq.run_retention();
BEGIN
    PERFORM batonq._fold_counts();
    RETURN v_report;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.maintain() TO batonq_worker;

-- Today's partitions and the next few exist as soon as the schema does, not
-- only after the sweeper's first maintain(); harmless when they already do.
SELECT batonq.ensure_partitions();
