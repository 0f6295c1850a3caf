-- batonq engine: wake-ups. Enqueues notify the claimers waiting on a queue
-- (LISTEN batonq), only while someone waits (batonq.awaited).

-- Wake the claimers waiting for a queue that has a task claimable now.
-- NOTIFY goes out only while someone awaits the queue: every commit that
-- notifies takes one database-wide lock, so unconditional NOTIFYs line busy
-- producers' commits up one behind the other.
--
-- The look cannot miss a waiter that registers meanwhile: it is made under
-- a shared lock that batonq.await_work takes exclusively. Either the
-- registration waits for this transaction to commit (and the waiter, which
-- looks for work once more after registering, sees this task), or it
-- committed before the look below took its snapshot. A registration under
-- way (the lock is taken or asked for) gets a NOTIFY without a look: the
-- enqueue never waits for a waiter. Above READ COMMITTED the snapshot may
-- predate a registration: such a transaction notifies without looking.
CREATE OR REPLACE FUNCTION batonq._wake(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND pg_try_advisory_xact_lock_shared(hashtext('batonq.awaited'), hashtext(p_queue)) THEN
        -- A new statement, so a snapshot taken with the lock held.
        IF NOT EXISTS (SELECT FROM batonq.awaited WHERE queue = p_queue AND until > now()) THEN
            RETURN;
        END IF;
    END IF;
    PERFORM pg_notify('batonq', p_queue);
END $$;

-- Ask for wake-ups: until p_for_s seconds from now, every transaction that
-- makes a task of p_queue claimable now sends NOTIFY batonq, '<queue>'.
-- Register while LISTENing, then look for work once more before sleeping:
-- a task that became claimable before the registration committed did not
-- notify. The lock waits for the enqueues that are looking for waiters
-- right now (batonq._wake) to commit, so that look sees their tasks. A
-- transaction that enqueued and stays open (the caller's own, around an
-- enqueue) is not waited for beyond lock_timeout: its task is found by the
-- waiters' next poll.
CREATE OR REPLACE FUNCTION batonq.await_work(p_queue text, p_for_s double precision) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET lock_timeout = '500ms' AS $$
DECLARE
    v_until timestamptz;
BEGIN
    PERFORM batonq._check_queue_name(p_queue);
    IF p_for_s IS NULL OR p_for_s <= 0 OR p_for_s > 3600 THEN
        PERFORM batonq._invalid_argument('for_s must be above 0 and at most 3600');
    END IF;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('batonq.awaited'), hashtext(p_queue));
    EXCEPTION WHEN lock_not_available THEN
        NULL;  -- register all the same: later enqueues see it
    END;
    INSERT INTO batonq.awaited AS a (queue, until)
    VALUES (p_queue, clock_timestamp() + make_interval(secs => p_for_s))
    ON CONFLICT (queue) DO UPDATE SET until = greatest(a.until, excluded.until)
    RETURNING a.until INTO v_until;
    RETURN v_until;
END $$;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.await_work(text, double precision) TO batonq_reader;
