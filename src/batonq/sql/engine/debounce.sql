-- batonq engine: debounced enqueue.

-- Enqueue with debounce: enqueues of one key within p_debounce_s of each
-- other collapse into one task, which becomes claimable p_debounce_s after
-- the last of them -- or p_max_wait_s after the first, so that a steady
-- stream still runs. p_keep says whose payload the task carries: 'last'
-- (each enqueue replaces it) or 'first'. Once the task has been claimed, the
-- next enqueue of the key opens a new window with a new task.
--
-- Enqueues of one key queue on a transaction-scoped advisory lock, so the
-- window's row and its task change together, one enqueue at a time; a
-- claim that takes the task meanwhile holds its row lock, and the update
-- below then finds it no longer pending and opens a new window instead.
CREATE OR REPLACE FUNCTION batonq.enqueue_debounced(
    p_queue        text,
    p_key          text,
    p_payload      jsonb,
    p_debounce_s   double precision,
    p_max_wait_s   double precision DEFAULT NULL,
    p_keep         text DEFAULT 'last',
    p_priority     integer DEFAULT 0,
    p_max_attempts integer DEFAULT NULL,
    p_group        text DEFAULT NULL
) RETURNS batonq.enqueued
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_queue   batonq.queues := batonq._queue(p_queue, true);
    v_window  batonq.debounces;
    v_reply   batonq.enqueued;
BEGIN
    IF p_key IS NULL OR length(p_key) NOT BETWEEN 1 AND 512 THEN
        PERFORM batonq._invalid_argument('debounce_key must be 1-512 characters');
    END IF;
    IF p_debounce_s IS NULL OR p_debounce_s <= 0 OR p_debounce_s > 86400 THEN
        PERFORM batonq._invalid_argument('debounce_s must be over 0 and at most 86400 (a day)');
    END IF;
    IF p_max_wait_s IS NOT NULL AND (p_max_wait_s < p_debounce_s OR p_max_wait_s > 315360000) THEN
        PERFORM batonq._invalid_argument('max_wait_s must be at least debounce_s and at most 315360000 (10 years)');
    END IF;
    IF p_keep IS NULL OR p_keep NOT IN ('first', 'last') THEN
        PERFORM batonq._invalid_argument('keep must be first or last');
    END IF;
    PERFORM batonq._check_enqueue_args(p_priority, 0, p_max_attempts);
    PERFORM batonq._check_group(p_group);
    PERFORM batonq._check_json('payload', p_payload, v_queue.max_body_bytes);
    PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || E'\n' || p_key, 13));

    SELECT * INTO v_window FROM batonq.debounces WHERE queue = p_queue AND key = p_key;
    IF FOUND THEN
        UPDATE batonq.tasks
           SET run_at = least(now() + make_interval(secs => p_debounce_s),
                              v_window.opened_at + make_interval(secs => coalesce(p_max_wait_s, 315360000))),
               payload = CASE WHEN p_keep = 'last' THEN p_payload ELSE payload END,
               group_key = CASE WHEN p_keep = 'last' THEN p_group ELSE group_key END
         -- Never claimed (no fencing token yet): a task that was claimed,
         -- even one pending again for a retry, has closed its window.
         WHERE queue = p_queue AND id = v_window.task_id AND state = 'pending'
           AND fencing_token IS NULL
        RETURNING id, queue, false, state, run_at INTO v_reply;
        IF FOUND THEN
            RETURN v_reply;
        END IF;
    END IF;
    -- No open window (none yet, or its task was claimed, held or finished).
    v_reply := batonq.enqueue(p_queue, p_payload, p_priority, p_debounce_s, p_max_attempts,
                              p_group => p_group);
    INSERT INTO batonq.debounces (queue, key, task_id, opened_at)
    VALUES (p_queue, p_key, v_reply.task_id, now())
    ON CONFLICT (queue, key) DO UPDATE SET task_id = excluded.task_id, opened_at = excluded.opened_at;
    RETURN v_reply;
END $$;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    batonq.enqueue_debounced(text, text, jsonb, double precision, double precision, text, integer, integer, text)
TO batonq_worker;
