-- batonq engine: writes about a leased task (complete, fail, heartbeat,
-- release), each checked against the lease token.
--
-- A write is accepted while its fencing token is the task's newest and the
-- task is unfinished: leased, or pending after its lease ran out with nobody
-- claiming it since (nobody else holds it). The first accepted complete or
-- fail per (task, token) is the outcome; a repeat of the same write kind
-- under the same lease token returns it with outcome 'replayed' and changes
-- nothing (an accepted complete is found in the archive, an accepted fail in
-- the submit ledger, each with its lease secret). A complete after a fail, a
-- fail after a complete, is no replay. Anything else is refused with outcome
-- 'lease_lost' (or 'finished', when the task is done, dead or cancelled) and
-- the task's current state and token, and set aside in the submit ledger.

-- The slow path of every write that did not match a live lease: replay,
-- refusal, or an error for an unknown task or a forged token.
CREATE OR REPLACE FUNCTION batonq._refuse(p_ref batonq.lease_ref, p_kind text, p_body jsonb)
RETURNS batonq.submit_reply
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_first  text;
    v_state  text;
    v_token  bigint;
    v_secret uuid;
    v_reply  batonq.submit_reply;
BEGIN
    -- The first outcome of this write kind under this lease token: an
    -- accepted complete is the task's archive row (only a complete makes a
    -- task done, and the row keeps its token and secret); an accepted fail
    -- is in the ledger.
    IF p_kind = 'complete' THEN
        v_first := (SELECT a.state FROM batonq.archive a
                     WHERE a.id = p_ref.task_id AND a.queue = p_ref.queue
                       AND a.fencing_token = p_ref.fencing_token AND a.state = 'done'
                       AND a.lease_secret = p_ref.secret
                     LIMIT 1);
    ELSIF p_kind = 'fail' THEN
        v_first := (SELECT s.state_after FROM batonq.submits s
                     WHERE s.task_id = p_ref.task_id AND s.fencing_token = p_ref.fencing_token
                       AND s.outcome = 'accepted' AND s.kind = 'fail' AND s.lease_secret = p_ref.secret
                     LIMIT 1);
    END IF;
    IF p_kind IN ('complete', 'fail') THEN
        IF v_first IS NOT NULL THEN
            INSERT INTO batonq.submits (task_id, queue, fencing_token, kind, outcome, state_after, body)
            VALUES (p_ref.task_id, p_ref.queue, p_ref.fencing_token, p_kind, 'replayed', v_first, p_body);
            RETURN ROW(p_ref.task_id, p_ref.queue, 'replayed', v_first,
                       p_ref.fencing_token, p_ref.fencing_token, NULL, NULL)::batonq.submit_reply;
        END IF;
    END IF;
    SELECT state, fencing_token, lease_secret INTO v_state, v_token, v_secret
      FROM batonq.tasks WHERE queue = p_ref.queue AND id = p_ref.task_id;
    IF NOT FOUND THEN
        SELECT state, fencing_token, lease_secret INTO v_state, v_token, v_secret
          FROM batonq.archive WHERE id = p_ref.task_id AND queue = p_ref.queue LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % not found in queue %', p_ref.task_id, p_ref.queue
                USING ERRCODE = 'BQ002', DETAIL = jsonb_build_object('task_id', p_ref.task_id)::text;
        END IF;
    END IF;
    -- The right fencing token with another secret is a forged or garbled
    -- token, hot or finished.
    IF v_token = p_ref.fencing_token AND v_secret IS DISTINCT FROM p_ref.secret
       AND v_secret IS NOT NULL THEN
        RAISE EXCEPTION 'wrong lease token for task %', p_ref.task_id
            USING ERRCODE = 'BQ005', DETAIL = jsonb_build_object('task_id', p_ref.task_id)::text;
    END IF;
    INSERT INTO batonq.submits (task_id, queue, fencing_token, kind, outcome, state_after, body)
    VALUES (p_ref.task_id, p_ref.queue, p_ref.fencing_token, p_kind, 'set_aside', v_state, p_body);
    RETURN ROW(p_ref.task_id, p_ref.queue,
               CASE WHEN v_state IN ('done', 'dead', 'cancelled') THEN 'finished' ELSE 'lease_lost' END,
               v_state, p_ref.fencing_token, v_token, NULL, NULL)::batonq.submit_reply;
END $$;

-- The lease token of a lease named by its task and fencing token, for the
-- API key p_key_id: the real token when that key claimed the lease and it is
-- still the task's; otherwise a token whose secret matches no lease, which
-- the writes refuse exactly as they refuse a forged one (wrong lease token,
-- lease_lost or finished, set aside; a replay of an accepted complete).
-- Not granted to the worker role: a key id is no secret, so only the
-- service, which checked the key itself, may vouch for one.
CREATE OR REPLACE FUNCTION batonq.lease_token_for_key(p_task_id bigint, p_fencing_token bigint, p_key_id bigint)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_queue  text;
    v_token  bigint;
    v_key    bigint;
    v_secret uuid;
BEGIN
    SELECT queue, fencing_token, claim_key, lease_secret INTO v_queue, v_token, v_key, v_secret
      FROM batonq.tasks WHERE id = p_task_id;
    IF NOT FOUND THEN
        -- Finished: the archive keeps the last lease's secret and key, so
        -- that key's repeated complete or fail is still a replay.
        SELECT queue, fencing_token, claim_key, lease_secret INTO v_queue, v_token, v_key, v_secret
          FROM batonq.archive WHERE id = p_task_id LIMIT 1;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task t_% not found', p_task_id
                USING ERRCODE = 'BQ002', DETAIL = jsonb_build_object('task_id', p_task_id)::text;
        END IF;
    ELSIF v_token = p_fencing_token AND v_key = p_key_id AND v_secret IS NULL THEN
        -- Failed and waiting for its retry: the accepted fail kept the
        -- secret in the ledger, for the same key's repeated fail.
        v_secret := (SELECT s.lease_secret FROM batonq.submits s
                      WHERE s.task_id = p_task_id AND s.fencing_token = p_fencing_token
                        AND s.outcome = 'accepted' AND s.kind = 'fail'
                      LIMIT 1);
    END IF;
    IF v_token = p_fencing_token AND v_key = p_key_id AND v_secret IS NOT NULL THEN
        RETURN batonq._lease_token(v_queue, p_task_id, p_fencing_token, v_secret);
    END IF;
    RETURN batonq._lease_token(v_queue, p_task_id, p_fencing_token, '00000000-0000-0000-0000-000000000000');
END $$;

-- What a complete needs of its queue's settings, in one look: the limit of
-- a result's size, and whether a concurrency limit waits for the lease to
-- end (batonq._lease_ended). PL/pgSQL, not SQL: its plan is cached (a SQL
-- function with a subquery is planned at every call).
CREATE OR REPLACE FUNCTION batonq._submit_settings(p_queue text, OUT max_body_bytes integer,
                                                   OUT lease_limited boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT q.max_body_bytes, q.max_leased IS NOT NULL OR q.group_max_leased IS NOT NULL
      INTO max_body_bytes, lease_limited
      FROM batonq.queues q WHERE q.name = p_queue;
    max_body_bytes := coalesce(max_body_bytes, 131072);
    lease_limited := coalesce(lease_limited, false);
END $$;

-- Complete a leased task of p_queue with its result: it moves to the archive
-- as done.
CREATE OR REPLACE FUNCTION batonq.complete_in(p_queue text, p_lease_token text, p_result jsonb DEFAULT NULL,
                                              p_trace_context jsonb DEFAULT NULL)
RETURNS batonq.submit_reply
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ref      batonq.lease_ref := batonq._parse_token_in(p_queue, p_lease_token);
    v_settings record := batonq._submit_settings(v_ref.queue);
    v_id       bigint;
    v_joined   boolean;
BEGIN
    PERFORM batonq._check_json('result', p_result, v_settings.max_body_bytes);
    WITH moved AS (
        DELETE FROM batonq.tasks t
         WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id
           AND t.fencing_token = v_ref.fencing_token AND t.lease_secret = v_ref.secret
           AND t.state IN ('leased', 'pending')
        RETURNING t
    ), archived AS (
        INSERT INTO batonq.archive
        SELECT (batonq._archive_row(m.t, 'done', p_result, p_trace_context => p_trace_context)).* FROM moved m
    )
    SELECT (m.t).id, (m.t).join_task_id IS NOT NULL INTO v_id, v_joined FROM moved m;
    IF v_id IS NULL THEN
        RETURN batonq._refuse(v_ref, 'complete', p_result);
    END IF;
    IF v_settings.lease_limited THEN
        PERFORM batonq._wake(v_ref.queue);  -- room under the limit: see _lease_ended
    END IF;
    -- The batons leave in the transaction that accepts the completion.
    IF v_joined OR EXISTS (SELECT FROM batonq.edges e WHERE e.from_queue = v_ref.queue) THEN
        PERFORM batonq._hand_off(v_ref.queue, ARRAY[v_id]);
    END IF;
    RETURN ROW(v_ref.task_id, v_ref.queue, 'accepted', 'done', v_ref.fencing_token,
               v_ref.fencing_token, NULL, NULL)::batonq.submit_reply;
END $$;

-- Complete many leased tasks of p_queue in one call: one reply per token, in
-- order; an unknown task or a forged token is one item's outcome (not_found,
-- invalid_token), not an error of the call.
-- Tokens are parsed once, into one array; the live leases move in one set of
-- statements, and only the rest (replays, refusals) go one by one. Unlike
-- the other functions it may plan for its arguments (plan_cache_mode auto):
-- a batch pays for one plan, and a generic DELETE on the partitioned table
-- opens all 16 partitions.
CREATE OR REPLACE FUNCTION batonq.complete_many_in(p_queue text, p_lease_tokens text[], p_results jsonb[] DEFAULT NULL,
                                                   p_trace_contexts jsonb[] DEFAULT NULL)
RETURNS TABLE (ord integer, task_id bigint, queue text, outcome text, state text,
               fencing_token bigint, current_fencing_token bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = auto SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_refs      batonq.lease_ref[] := ARRAY(
        SELECT batonq._parse_token_in(p_queue, u.tok)
          FROM unnest(p_lease_tokens) WITH ORDINALITY AS u(tok, ord)
         ORDER BY u.ord);
    v_n         integer := cardinality(v_refs);
    v_done      boolean[] := array_fill(false, ARRAY[v_n]);
    v_settings  record := batonq._submit_settings(p_queue);
    v_limit     integer := v_settings.max_body_bytes;
    v_bad       integer;
    v_moved     integer[];
    v_moved_ids bigint[];
    v_joined    boolean;
    v_replies   batonq.submit_reply[] := '{}';
    v_ord       integer;
BEGIN
    IF cardinality(p_results) > v_n OR cardinality(p_trace_contexts) > v_n THEN
        PERFORM batonq._invalid_argument('results and trace_contexts may not be longer than lease_tokens');
    END IF;
    SELECT u.ord INTO v_bad
      FROM unnest(p_results) WITH ORDINALITY AS u(res, ord),
           LATERAL (SELECT u.res::text AS txt OFFSET 0) x  -- as in enqueue_many
     WHERE octet_length(x.txt) >= least(v_limit + 1, 2 * batonq._max_json_depth() + 2)
       AND NOT batonq._json_fits(u.res, x.txt, v_limit)
     LIMIT 1;
    IF v_bad IS NOT NULL THEN
        PERFORM batonq._check_json(format('result %s', v_bad), p_results[v_bad], v_limit);
    END IF;
    WITH input AS MATERIALIZED (
        SELECT u.ord, u.id, u.fence, u.secret, u.res, u.trace
          FROM unnest(v_refs, p_results, p_trace_contexts) WITH ORDINALITY AS u(q, id, fence, secret, res, trace, ord)
    ), moved AS (
        -- Each input row probes the primary key: (id, queue) names one
        -- row. (An added id = ANY (all ids) rode along into every probe,
        -- and the index scan sorted the whole array again for each row.)
        DELETE FROM batonq.tasks t
         USING input i
         WHERE t.queue = p_queue AND t.id = i.id AND t.fencing_token = i.fence
           AND t.lease_secret = i.secret AND t.state IN ('leased', 'pending')
        RETURNING t, i.res, i.trace, i.ord
    ), archived AS (
        INSERT INTO batonq.archive
        SELECT (batonq._archive_row(m.t, 'done', m.res, p_trace_context => m.trace)).* FROM moved m
    )
    SELECT array_agg(m.ord::integer), array_agg((m.t).id), bool_or((m.t).join_task_id IS NOT NULL)
      INTO v_moved, v_moved_ids, v_joined
      FROM moved m;
    IF v_moved IS NOT NULL THEN
        FOREACH v_ord IN ARRAY v_moved LOOP
            v_done[v_ord] := true;
        END LOOP;
        IF v_settings.lease_limited THEN
            PERFORM batonq._wake(p_queue);  -- room under the limit: see _lease_ended
        END IF;
        -- The batons leave in the transaction that accepts the completions.
        IF v_joined OR EXISTS (SELECT FROM batonq.edges e WHERE e.from_queue = p_queue) THEN
            PERFORM batonq._hand_off(p_queue, v_moved_ids);
        END IF;
    END IF;

    -- The rest: replays and refusals, each with its own answer.
    IF coalesce(cardinality(v_moved), 0) < v_n THEN
        FOR i IN 1 .. v_n LOOP
            CONTINUE WHEN v_done[i];
            -- An unknown task or a forged token is answered for its item
            -- alone: the other items stand.
            BEGIN
                v_replies[i] := batonq._refuse(v_refs[i], 'complete', p_results[i]);
            EXCEPTION WHEN SQLSTATE 'BQ002' OR SQLSTATE 'BQ005' THEN
                v_replies[i] := ROW((v_refs[i]).task_id, (v_refs[i]).queue,
                                    CASE SQLSTATE WHEN 'BQ002' THEN 'not_found' ELSE 'invalid_token' END,
                                    NULL, (v_refs[i]).fencing_token, NULL, NULL, NULL)::batonq.submit_reply;
            END;
        END LOOP;
    END IF;

    RETURN QUERY
    SELECT i, (v_refs[i]).task_id, (v_refs[i]).queue,
           CASE WHEN v_done[i] THEN 'accepted' ELSE (v_replies[i]).outcome END,
           CASE WHEN v_done[i] THEN 'done' ELSE (v_replies[i]).state END,
           (v_refs[i]).fencing_token,
           CASE WHEN v_done[i] THEN (v_refs[i]).fencing_token ELSE (v_replies[i]).current_fencing_token END
      FROM generate_series(1, v_n) AS i;
END $$;

-- Fail a leased task. requeue = false, or no attempts left: dead, in the
-- archive. Otherwise pending again after retry_delay_s, or after the queue's
-- backoff when none is given; the lease is given up either way. Every
-- attempt's error is kept.
CREATE OR REPLACE FUNCTION batonq.fail_in(
    p_queue         text,
    p_lease_token   text,
    p_error         jsonb DEFAULT NULL,
    p_retry_delay_s double precision DEFAULT NULL,
    p_requeue       boolean DEFAULT true
) RETURNS batonq.submit_reply
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ref   batonq.lease_ref := batonq._parse_token_in(p_queue, p_lease_token);
    v_queue batonq.queues;
    v_task  batonq.tasks;
    v_state text;
    v_entry jsonb;
    v_delay_s double precision;
BEGIN
    IF p_retry_delay_s < 0 OR p_retry_delay_s > 315360000 THEN
        PERFORM batonq._invalid_argument('retry_delay_s must be between 0 and 315360000 (10 years)');
    END IF;
    SELECT * INTO v_queue FROM batonq.queues WHERE name = v_ref.queue;
    PERFORM batonq._check_json('error', p_error, coalesce(v_queue.max_body_bytes, 131072));
    SELECT * INTO v_task FROM batonq.tasks t
     WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id
       AND t.fencing_token = v_ref.fencing_token AND t.lease_secret = v_ref.secret
       AND t.state IN ('leased', 'pending')
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN batonq._refuse(v_ref, 'fail', p_error);
    END IF;
    v_entry := batonq._attempt_error(v_task.attempts, v_task.fencing_token, p_error,
                                     v_task.worker, v_task.claim_key, v_task.claimed_at);
    IF NOT p_requeue OR v_task.attempts >= v_task.max_attempts THEN
        v_state := 'dead';
        DELETE FROM batonq.tasks t WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id;
        INSERT INTO batonq.archive
        SELECT (batonq._archive_row(v_task, 'dead', NULL, batonq._error_text(p_error),
                                    v_task.errors || v_entry)).*;
        IF v_task.join_task_id IS NOT NULL THEN
            PERFORM batonq._on_dead(v_ref.queue, ARRAY[v_task.id]);
        END IF;
    ELSE
        v_state := 'pending';
        v_delay_s := coalesce(p_retry_delay_s, batonq._backoff_s(v_queue, v_task.attempts));
        UPDATE batonq.tasks t SET
            state = 'pending',
            run_at = now() + make_interval(secs => v_delay_s),
            lease_secret = NULL,
            lease_expires_at = NULL,
            last_error = batonq._error_text(p_error),
            errors = t.errors || v_entry
         WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id;
        IF v_delay_s <= 0 THEN
            PERFORM batonq._wake(v_ref.queue);  -- claimable again now
        END IF;
    END IF;
    IF v_task.state = 'leased' AND (v_state = 'dead' OR v_delay_s > 0) THEN
        PERFORM batonq._lease_ended(v_ref.queue);  -- (a retry due now woke them above)
    END IF;
    INSERT INTO batonq.submits (task_id, queue, fencing_token, kind, outcome, state_after, body,
                                lease_secret)
    VALUES (v_ref.task_id, v_ref.queue, v_ref.fencing_token, 'fail', 'accepted', v_state, p_error,
            v_ref.secret);
    RETURN ROW(v_ref.task_id, v_ref.queue, 'accepted', v_state, v_ref.fencing_token,
               v_ref.fencing_token, NULL, NULL)::batonq.submit_reply;
END $$;

-- Extend a lease by p_lease_s (default: the claim's lease length) from now,
-- and optionally set the task's stage text. A lease that ran out with nobody
-- claiming since is taken up again, if the queue's concurrency limits leave
-- room for it (batonq._room_for: checked only then).
CREATE OR REPLACE FUNCTION batonq.heartbeat_in(
    p_queue       text,
    p_lease_token text,
    p_lease_s     integer DEFAULT NULL,
    p_stage       text DEFAULT NULL
) RETURNS batonq.submit_reply
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ref     batonq.lease_ref := batonq._parse_token_in(p_queue, p_lease_token);
    v_expires timestamptz;
BEGIN
    IF p_lease_s < 1 OR p_lease_s > 3600 THEN
        PERFORM batonq._invalid_argument('lease_s must be between 1 and 3600');
    END IF;
    UPDATE batonq.tasks t SET
        state = 'leased',
        lease_s = coalesce(p_lease_s, t.lease_s),
        lease_expires_at = now() + make_interval(secs => coalesce(p_lease_s, t.lease_s)),
        stage = coalesce(p_stage, t.stage)
     WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id
       AND t.fencing_token = v_ref.fencing_token AND t.lease_secret = v_ref.secret
       AND (t.state = 'leased' OR t.state = 'pending' AND batonq._room_for(t.queue, t.group_key))
    RETURNING t.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        RETURN batonq._refuse(v_ref, 'heartbeat', to_jsonb(p_stage));
    END IF;
    RETURN ROW(v_ref.task_id, v_ref.queue, 'accepted', 'leased', v_ref.fencing_token,
               v_ref.fencing_token, v_expires,
               extract(epoch FROM v_expires - now())::double precision)::batonq.submit_reply;
END $$;

-- Give a lease back unfinished (a worker shutting down): the task is
-- claimable at once and the attempt is not counted.
CREATE OR REPLACE FUNCTION batonq.release_lease_in(p_queue text, p_lease_token text) RETURNS batonq.submit_reply
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_ref batonq.lease_ref := batonq._parse_token_in(p_queue, p_lease_token);
BEGIN
    UPDATE batonq.tasks t SET
        state = 'pending',
        attempts = greatest(t.attempts - 1, 0),
        lease_secret = NULL,
        lease_expires_at = NULL,
        run_at = least(t.run_at, now())
     WHERE t.queue = v_ref.queue AND t.id = v_ref.task_id
       AND t.fencing_token = v_ref.fencing_token AND t.lease_secret = v_ref.secret
       AND t.state IN ('leased', 'pending');
    IF NOT FOUND THEN
        RETURN batonq._refuse(v_ref, 'release', NULL);
    END IF;
    PERFORM batonq._wake(v_ref.queue);
    RETURN ROW(v_ref.task_id, v_ref.queue, 'accepted', 'pending', v_ref.fencing_token,
               v_ref.fencing_token, NULL, NULL)::batonq.submit_reply;
END $$;

-- The same writes keyed by the lease token alone, for SQL callers: the queue
-- is the token's first part. The clients call the *_in forms, which a
-- sharded deployment can route by their first argument (docs/scaling.md).
CREATE OR REPLACE FUNCTION batonq.complete(p_lease_token text, p_result jsonb DEFAULT NULL)
RETURNS batonq.submit_reply
LANGUAGE sql
RETURN batonq.complete_in(split_part(p_lease_token, '/', 1), p_lease_token, p_result);

CREATE OR REPLACE FUNCTION batonq.fail(
    p_lease_token   text,
    p_error         jsonb DEFAULT NULL,
    p_retry_delay_s double precision DEFAULT NULL,
    p_requeue       boolean DEFAULT true
) RETURNS batonq.submit_reply
LANGUAGE sql
RETURN batonq.fail_in(split_part(p_lease_token, '/', 1), p_lease_token, p_error, p_retry_delay_s, p_requeue);

CREATE OR REPLACE FUNCTION batonq.heartbeat(
    p_lease_token text,
    p_lease_s     integer DEFAULT NULL,
    p_stage       text DEFAULT NULL
) RETURNS batonq.submit_reply
LANGUAGE sql
RETURN batonq.heartbeat_in(split_part(p_lease_token, '/', 1), p_lease_token, p_lease_s, p_stage);

CREATE OR REPLACE FUNCTION batonq.release_lease(p_lease_token text) RETURNS batonq.submit_reply
LANGUAGE sql
RETURN batonq.release_lease_in(split_part(p_lease_token, '/', 1), p_lease_token);

-- Tokens of many queues: complete_many_in once per queue, the replies back
-- in the tokens' order.
CREATE OR REPLACE FUNCTION batonq.complete_many(p_lease_tokens text[], p_results jsonb[] DEFAULT NULL,
                                                p_trace_contexts jsonb[] DEFAULT NULL)
RETURNS TABLE (ord integer, task_id bigint, queue text, outcome text, state text,
               fencing_token bigint, current_fencing_token bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF cardinality(p_results) > cardinality(p_lease_tokens)
       OR cardinality(p_trace_contexts) > cardinality(p_lease_tokens) THEN
        PERFORM batonq._invalid_argument('results and trace_contexts may not be longer than lease_tokens');
    END IF;
    RETURN QUERY
    SELECT g.ords[r.ord], r.task_id, r.queue, r.outcome, r.state, r.fencing_token, r.current_fencing_token
      FROM (SELECT split_part(u.tok, '/', 1) AS q, array_agg(u.tok ORDER BY u.o) AS toks,
                   array_agg(u.res ORDER BY u.o) AS results, array_agg(u.trace ORDER BY u.o) AS traces,
                   array_agg(u.o::integer ORDER BY u.o) AS ords
              FROM unnest(p_lease_tokens, p_results, p_trace_contexts) WITH ORDINALITY AS u(tok, res, trace, o)
             GROUP BY 1) g,
           LATERAL batonq.complete_many_in(g.q, g.toks, g.results, g.traces) r
     ORDER BY 1;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    batonq.heartbeat_in(text, text, integer, text),
    batonq.complete_in(text, text, jsonb, jsonb),
    batonq.complete_many_in(text, text[], jsonb[], jsonb[]),
    batonq.fail_in(text, text, jsonb, double precision, boolean),
    batonq.release_lease_in(text, text),
    batonq.heartbeat(text, integer, text),
    batonq.complete(text, jsonb),
    batonq.complete_many(text[], jsonb[], jsonb[]),
    batonq.fail(text, jsonb, double precision, boolean),
    batonq.release_lease(text)
TO batonq_worker;
GRANT EXECUTE ON FUNCTION batonq.lease_token_for_key(bigint, bigint, bigint) TO batonq_service;
