-- batonq engine: leader election for the sweepers' duties, by a lease in a
-- row (batonq.leaders). No session state: it works through a transaction
-- pooler, and a leader's term is bounded by the database's clock alone.

-- Lead p_duty for p_lease_s more seconds: renew the lease p_holder holds,
-- or take it over once it has run out (or was given up). The fencing token
-- of the term, NULL while another holds it. A standby reads the row and
-- writes nothing; two standbys taking over at once queue on the row lock,
-- and the second sees the first's term (its WHERE is checked again).
CREATE OR REPLACE FUNCTION batonq.lead(p_duty text, p_holder text, p_lease_s double precision)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_token bigint;
    v_until timestamptz := now() + make_interval(secs => p_lease_s);
BEGIN
    IF p_lease_s IS NULL OR p_lease_s <= 0 OR p_lease_s > 3600 THEN
        PERFORM batonq._invalid_argument('lease_s must be over 0 and at most 3600');
    END IF;
    UPDATE batonq.leaders l
       SET token = CASE WHEN l.holder = p_holder THEN l.token ELSE l.token + 1 END,
           since = CASE WHEN l.holder = p_holder THEN l.since ELSE now() END,
           holder = p_holder, expires_at = v_until
     WHERE l.duty = p_duty AND (l.holder = p_holder OR l.expires_at <= now())
    RETURNING l.token INTO v_token;
    IF NOT FOUND THEN
        INSERT INTO batonq.leaders (duty, holder, token, since, expires_at)
        VALUES (p_duty, p_holder, 1, now(), v_until)
        ON CONFLICT (duty) DO NOTHING
        RETURNING token INTO v_token;
    END IF;
    RETURN v_token;
END $$;

-- Give p_duty up (a sweeper that stops): the next standby takes it at its
-- next look instead of when the lease would have run out.
CREATE OR REPLACE FUNCTION batonq.resign(p_duty text, p_holder text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    WITH gone AS (
        UPDATE batonq.leaders SET expires_at = now()
         WHERE duty = p_duty AND holder = p_holder AND expires_at > now()
        RETURNING 1)
    SELECT EXISTS (SELECT FROM gone);
END;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.lead(text, text, double precision), batonq.resign(text, text)
TO batonq_worker;
