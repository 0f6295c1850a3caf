-- batonq engine: helpers shared by the engine's functions. Not granted to the
-- worker or reader roles: only the engine calls them.
--
-- Errors raised by the engine carry their own SQLSTATEs (class BQ) and a JSON
-- DETAIL, which clients map to their exceptions:
--   BQ001 invalid_queue_name   BQ002 task_not_found   BQ003 too_large
--   BQ004 invalid_argument     BQ005 invalid_token    BQ006 queue_not_found
--   BQ007 invalid_state        BQ008 graph_cycle      BQ009 key_not_found
--   BQ010 json_too_deep        BQ011 number_too_large
-- A write refused because its lease is gone is not an error here: it is a
-- reply with outcome 'lease_lost', so the refusal can be recorded in the
-- submit ledger in the same transaction.

CREATE OR REPLACE FUNCTION batonq._check_queue_name(p_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_name IS NULL OR NOT batonq._valid_queue_name(p_name) THEN
        RAISE EXCEPTION 'invalid queue name %: use 1-128 characters from a-z 0-9 _ . : - starting with a letter or digit',
                        coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'BQ001', DETAIL = jsonb_build_object('queue', p_name)::text;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION batonq._invalid_argument(p_message text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%', p_message USING ERRCODE = 'BQ004';
END $$;

-- JSON bodies (payload, result, error) are limited by their size as compact
-- JSON text (UTF-8, no spaces between tokens), by how deep they nest and by
-- how long their numbers are. Deeper nesting and longer numbers are refused
-- because they could be stored but not served: on the way out pydantic and
-- orjson give up past 255 levels, Python's json past its recursion limit
-- (about 1,000), Python's int past 4,300 digits, a double past 1.8e308. The
-- limits leave room for the levels a reply wraps around a payload, a join's
-- list around its elements' results and a task's errors around an error.
CREATE OR REPLACE FUNCTION batonq._max_json_depth() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 64;

-- Numbers must be below 1e300 in magnitude: at most 300 digits before the
-- decimal point.
CREATE OR REPLACE FUNCTION batonq._max_number_digits() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 300;

-- p_text (jsonb's text form) measured as compact JSON: jsonb writes one
-- space after every ',' and ':' between tokens and no other space outside
-- strings, so the spaces left once the strings are cut out are the extra
-- bytes. Escaped backslashes and quotes go first, so every '"' left opens
-- or closes a string.
CREATE OR REPLACE FUNCTION batonq._compact_size(p_text text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT octet_length(p_text) - (octet_length(x.outside) - octet_length(replace(x.outside, ' ', '')))
          FROM (SELECT regexp_replace(replace(replace(p_text, '\\', ''), '\"', ''), '"[^"]*"', '', 'g')
                       AS outside) x);

-- The containers p_level levels down: a body that has one nests deeper than
-- p_level. IMMUTABLE, so that with a constant level the path is made once,
-- when the calling statement is planned, and not parsed again per call.
CREATE OR REPLACE FUNCTION batonq._nesting_path(p_level integer) RETURNS jsonpath
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN format('strict $.**{%s} ? (@.type() == "array" || @.type() == "object")', p_level)::jsonpath;

-- .abs() rather than .type() == "number": a third of the time on a 100 KiB
-- payload (a string's .abs() is an error, which the filter takes as false).
CREATE OR REPLACE FUNCTION batonq._huge_numbers() RETURNS jsonpath
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN format('strict $.** ? (@.abs() >= 1e%s)', batonq._max_number_digits())::jsonpath;

-- Whether p_body may be stored (size, depth, numbers). The text is made once;
-- the costlier looks run only where the text could fail them: nesting 65
-- levels takes 130 bytes, and jsonb writes every number out in full, so one
-- of 1e300 or more shows as a run of digits (255, as many as a regex counts)
-- that the text search finds in a quarter of the time of the walk.
-- p_text is p_body::text, made once by the caller.
CREATE OR REPLACE FUNCTION batonq._json_fits(p_body jsonb, p_text text, p_limit integer) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_size integer := octet_length(p_text);
BEGIN
    IF p_body IS NULL OR v_size < 2 * batonq._max_json_depth() + 2 THEN
        RETURN v_size IS NULL OR v_size <= p_limit OR batonq._compact_size(p_text) <= p_limit;
    END IF;
    RETURN (v_size <= p_limit OR batonq._compact_size(p_text) <= p_limit)
       AND NOT jsonb_path_exists(p_body, batonq._nesting_path(batonq._max_json_depth()))
       AND NOT (p_text ~ '[0-9]{255}' AND jsonb_path_exists(p_body, batonq._huge_numbers()));
END $$;

-- Refuse what _json_fits refuses, saying why: BQ003 for the size (as
-- compact JSON), BQ010 for the depth, BQ011 for a number.
CREATE OR REPLACE FUNCTION batonq._check_json(p_what text, p_body jsonb, p_limit integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_text  text := p_body::text;
    v_size  integer := octet_length(v_text);
    v_low   integer;
    v_high  integer;
    v_mid   integer;
    v_huge  numeric;
BEGIN
    -- Most bodies are short: no further call for them.
    IF p_body IS NULL OR (v_size <= p_limit AND v_size < 2 * batonq._max_json_depth() + 2)
       OR batonq._json_fits(p_body, v_text, p_limit) THEN
        RETURN;
    END IF;
    v_size := batonq._compact_size(v_text);
    IF v_size > p_limit THEN
        RAISE EXCEPTION '% is % bytes as compact JSON, over the limit of % bytes', p_what, v_size, p_limit
            USING ERRCODE = 'BQ003',
                  DETAIL = jsonb_build_object('what', p_what, 'size', v_size, 'limit', p_limit)::text;
    END IF;
    IF jsonb_path_exists(p_body, batonq._nesting_path(batonq._max_json_depth())) THEN
        -- The depth, for the message: it is over the limit, and every level
        -- takes two bytes of text.
        v_low := batonq._max_json_depth() + 1;
        v_high := v_size / 2;
        WHILE v_low < v_high LOOP
            v_mid := (v_low + v_high + 1) / 2;
            IF jsonb_path_exists(p_body, batonq._nesting_path(v_mid - 1)) THEN
                v_low := v_mid;
            ELSE
                v_high := v_mid - 1;
            END IF;
        END LOOP;
        RAISE EXCEPTION '% nests % levels deep; the limit is %', p_what, v_low, batonq._max_json_depth()
            USING ERRCODE = 'BQ010',
                  DETAIL = jsonb_build_object('what', p_what, 'depth', v_low,
                                              'limit', batonq._max_json_depth())::text;
    END IF;
    v_huge := jsonb_path_query_first(p_body, batonq._huge_numbers())::numeric;
    v_size := length(trunc(abs(v_huge))::text);
    RAISE EXCEPTION '% holds a number with % digits before the decimal point; the limit is %',
                    p_what, v_size, batonq._max_number_digits()
        USING ERRCODE = 'BQ011',
              DETAIL = jsonb_build_object('what', p_what, 'digits', v_size,
                                          'limit', batonq._max_number_digits())::text;
END $$;

-- A queue's settings; enqueue creates a queue on first use.
CREATE OR REPLACE FUNCTION batonq._queue(p_queue text, p_create boolean) RETURNS batonq.queues
LANGUAGE plpgsql AS $$
DECLARE
    v_queue batonq.queues;
BEGIN
    SELECT * INTO v_queue FROM batonq.queues WHERE name = p_queue;
    IF FOUND THEN
        RETURN v_queue;
    END IF;
    PERFORM batonq._check_queue_name(p_queue);
    IF NOT p_create THEN
        RAISE EXCEPTION 'queue % does not exist', p_queue
            USING ERRCODE = 'BQ006', DETAIL = jsonb_build_object('queue', p_queue)::text;
    END IF;
    INSERT INTO batonq.queues (name) VALUES (p_queue) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO STRICT v_queue FROM batonq.queues WHERE name = p_queue;
    RETURN v_queue;
END $$;

-- Casts, not bigint || text: that operator is only STABLE, and an IMMUTABLE
-- function calling it is not inlined (a function call per claimed row).
CREATE OR REPLACE FUNCTION batonq._lease_token(p_queue text, p_task_id bigint, p_fencing_token bigint, p_secret uuid)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN p_queue || '/' || p_task_id::text || '/' || p_fencing_token::text || '/'
       || replace(p_secret::text, '-', '');

-- STABLE, not VOLATILE, so that _parse_token may be inlined; with no
-- arguments it is never folded at plan time.
CREATE OR REPLACE FUNCTION batonq._malformed_token() RETURNS batonq.lease_ref
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RAISE EXCEPTION 'malformed lease token: use the lease_token returned by claim'
        USING ERRCODE = 'BQ005';
END $$;

-- A SQL function the planner inlines (so STABLE, like everything in it).
-- split_part rather than capture groups, and unbounded repeats with the
-- lengths checked apart: a pattern with bounded repeats ({1,18}, {32}) costs
-- about 7 us a token against 1 us, which was a quarter of a batch complete.
CREATE OR REPLACE FUNCTION batonq._parse_token(p_token text) RETURNS batonq.lease_ref
LANGUAGE sql STABLE
RETURN CASE
    WHEN p_token ~ '^[a-z0-9][-a-z0-9_.:]*/[0-9]+/[0-9]+/[0-9a-f]+$'
         AND length(split_part(p_token, '/', 1)) <= 128
         AND length(split_part(p_token, '/', 2)) <= 18 AND length(split_part(p_token, '/', 3)) <= 18
         AND length(split_part(p_token, '/', 4)) = 32
    THEN ROW(split_part(p_token, '/', 1), split_part(p_token, '/', 2)::bigint,
             split_part(p_token, '/', 3)::bigint, split_part(p_token, '/', 4)::uuid)::batonq.lease_ref
    ELSE batonq._malformed_token()
END;

-- A lease token for a call that names its queue first (complete_in and the
-- other writes, which a sharded deployment routes by that argument): a token
-- of another queue is refused like a forged one, since its task is not there.
CREATE OR REPLACE FUNCTION batonq._foreign_token(p_queue text, p_token text) RETURNS batonq.lease_ref
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM batonq._parse_token(p_token);  -- a malformed token says so first
    RAISE EXCEPTION 'lease token of queue %, not %', split_part(p_token, '/', 1), p_queue
        USING ERRCODE = 'BQ005';
END $$;

CREATE OR REPLACE FUNCTION batonq._parse_token_in(p_queue text, p_token text) RETURNS batonq.lease_ref
LANGUAGE sql STABLE
RETURN CASE
    WHEN split_part(p_token, '/', 1) = p_queue THEN batonq._parse_token(p_token)
    ELSE batonq._foreign_token(p_queue, p_token)
END;

-- The text an error body shows as last_error.
CREATE OR REPLACE FUNCTION batonq._error_text(p_error jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE jsonb_typeof(p_error) WHEN 'string' THEN p_error #>> '{}' ELSE p_error::text END;

-- One entry of a task's attempt history, with who held the lease (its
-- worker and the API key that claimed it) and when it began: a write set
-- aside later under that fencing token is shown with them
-- (batonq.set_aside_writes), and the dashboard shows every attempt's worker,
-- start and end ('at').
CREATE OR REPLACE FUNCTION batonq._attempt_error(p_attempt integer, p_fencing_token bigint, p_error jsonb,
                                      p_worker text DEFAULT NULL, p_key_id bigint DEFAULT NULL,
                                      p_started_at timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object('attempt', p_attempt, 'fencing_token', p_fencing_token,
                          'at', now(), 'error', p_error, 'worker', p_worker, 'key_id', p_key_id,
                          'started_at', p_started_at);

-- Exponential backoff with jitter: base * 2^(attempt-1), capped, then scaled
-- by a random factor in [0.5, 1) so failed tasks do not retry in lockstep.
CREATE OR REPLACE FUNCTION batonq._backoff_s(p_queue batonq.queues, p_attempt integer) RETURNS double precision
LANGUAGE sql VOLATILE
RETURN least(p_queue.backoff_max_s,
             p_queue.backoff_base_s * power(2, least(greatest(p_attempt, 1) - 1, 60)))
       * (0.5 + random() / 2);

-- A hot row as it enters the archive, finished in p_state. NULL for
-- p_last_error or p_errors keeps the row's own.
-- p_trace_context: the context of the run that finished the task (its
-- batons carry it), when the finisher gave one; else the enqueuer's.
CREATE OR REPLACE FUNCTION batonq._archive_row(t batonq.tasks, p_state text, p_result jsonb,
                                    p_last_error text DEFAULT NULL, p_errors jsonb DEFAULT NULL,
                                    p_trace_context jsonb DEFAULT NULL)
RETURNS batonq.archive
LANGUAGE sql STABLE
RETURN ROW(t.id, t.queue, p_state, t.priority, t.run_at, t.created_at, t.payload, t.attempts,
           t.max_attempts, t.idempotency_key, t.parent_id, t.root_id, t.fencing_token,
           t.claimed_at, t.worker, t.stage, coalesce(p_last_error, t.last_error),
           coalesce(p_errors, t.errors), t.join_task_id, t.fan_index, p_result, now(),
           t.lease_secret, t.claim_key, t.group_key,
           coalesce(p_trace_context, t.trace_context))::batonq.archive;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;

-- Whether a task in p_state, due at p_run_at, is what a list asks for:
-- p_wanted names a state, or 'scheduled' (pending, not due yet); NULL asks
-- for every task. SQL, so the planner inlines it into the list's filter.
CREATE OR REPLACE FUNCTION batonq._in_state(p_state text, p_run_at timestamptz, p_wanted text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_wanted IS NULL OR p_state = p_wanted
        OR (p_wanted = 'scheduled' AND p_state = 'pending' AND p_run_at > now())
$$;
