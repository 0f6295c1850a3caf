-- batonq engine: API keys for the HTTP service and the MCP server.
--
-- A key is bq_<id>_<secret>. Only sha256(secret) is stored; the key is
-- returned once, by create_key. A key has a ring (0 admin, 1 operator,
-- 2 worker, 3 observer: a ring-N key may do all that rings N..3 may) and
-- queue scopes (glob patterns such as 'shop:*'). No role gets the key
-- functions: the service calls them as the schema's owner.
--
-- A dashboard session is a random token in the browser's cookie, only its
-- sha256 stored: signing in with a key starts one, signing out or revoking
-- the key ends it, and it expires 12 hours after sign-in (retention removes
-- it then). The session functions do nothing without a secret (the key's
-- secret hash, which only the owner may read, or the session's token), so
-- batonq_worker may call them: a service that runs as a member of it starts,
-- checks and ends sessions without touching the table.

CREATE OR REPLACE FUNCTION batonq._key_view(k batonq.api_keys) RETURNS batonq.api_key
LANGUAGE sql IMMUTABLE
RETURN ROW(k.id, k.name, k.ring, k.queues, k.created_at, k.last_used_at, k.revoked_at)::batonq.api_key;

-- Make a key; the only time its secret is seen.
CREATE OR REPLACE FUNCTION batonq.create_key(p_ring integer, p_queues text[] DEFAULT '{*}', p_name text DEFAULT '')
RETURNS TABLE (key text, id bigint, name text, ring smallint, queues text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_secret text := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    v_key    batonq.api_keys;
BEGIN
    IF p_ring IS NULL OR p_ring NOT BETWEEN 0 AND 3 THEN
        PERFORM batonq._invalid_argument('ring must be 0 (admin), 1 (operator), 2 (worker) or 3 (observer)');
    END IF;
    IF p_queues IS NULL OR cardinality(p_queues) = 0 OR array_position(p_queues, NULL) IS NOT NULL
       OR EXISTS (SELECT FROM unnest(p_queues) q WHERE q !~ '^[a-z0-9_.:*?\[\]-]{1,128}$') THEN
        PERFORM batonq._invalid_argument(
            'queues must be glob patterns of queue names, such as shop:* or mail:outbox');
    END IF;
    INSERT INTO batonq.api_keys (name, ring, queues, secret_hash)
    VALUES (coalesce(p_name, ''), p_ring, p_queues, sha256(convert_to(v_secret, 'UTF8')))
    RETURNING * INTO v_key;
    RETURN QUERY SELECT 'bq_' || v_key.id || '_' || v_secret, v_key.id, v_key.name, v_key.ring, v_key.queues;
END $$;

-- Mark a key used, at most once a minute, so checking it costs no write
-- per request.
CREATE OR REPLACE FUNCTION batonq._key_used(p_id bigint) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    UPDATE batonq.api_keys SET last_used_at = now()
     WHERE id = p_id AND revoked_at IS NULL
       AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');
END;

-- What the service needs to check a presented key: the stored hash (it
-- compares in constant time itself), ring and scopes. Marks the key used.
CREATE OR REPLACE FUNCTION batonq.key_for_auth(p_id bigint)
RETURNS TABLE (secret_hash bytea, ring smallint, queues text[], revoked boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
BEGIN
    PERFORM batonq._key_used(p_id);
    RETURN QUERY SELECT k.secret_hash, k.ring, k.queues, k.revoked_at IS NOT NULL
                   FROM batonq.api_keys k WHERE k.id = p_id;
END $$;

CREATE OR REPLACE FUNCTION batonq.list_keys() RETURNS SETOF batonq.api_key
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    SELECT (batonq._key_view(k)).* FROM batonq.api_keys k ORDER BY k.id;
END;

CREATE OR REPLACE FUNCTION batonq.revoke_key(p_id bigint) RETURNS batonq.api_key
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_key batonq.api_keys;
BEGIN
    UPDATE batonq.api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = p_id
    RETURNING * INTO v_key;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'key % not found', p_id USING ERRCODE = 'BQ009',
              DETAIL = jsonb_build_object('key_id', p_id)::text;
    END IF;
    -- Signed out everywhere at once (session_for_auth refuses them anyway).
    DELETE FROM batonq.dashboard_sessions WHERE key_id = p_id;
    RETURN batonq._key_view(v_key);
END $$;

-- The first admin key, only while there is no key at all; NULL otherwise.
-- The table lock makes two services starting at once print one key.
CREATE OR REPLACE FUNCTION batonq.create_first_key()
RETURNS TABLE (key text, id bigint, name text, ring smallint, queues text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
BEGIN
    LOCK TABLE batonq.api_keys IN EXCLUSIVE MODE;
    IF NOT EXISTS (SELECT FROM batonq.api_keys) THEN
        RETURN QUERY SELECT * FROM batonq.create_key(0, '{*}', 'first admin');
    END IF;
END $$;

-- Sign in to the dashboard: a session for the key bq_<p_key_id>_<secret>
-- (p_secret_hash is sha256(secret)), under the token whose sha256 is
-- p_token_hash; the key's ring and scopes, or no row for a key that is
-- unknown, revoked or not this secret. The hashes are compared here, not in
-- constant time: a timing difference tells at most how a stored hash
-- begins, and finding a secret with that hash is no easier for it.
CREATE OR REPLACE FUNCTION batonq.create_session(p_key_id bigint, p_secret_hash bytea, p_token_hash bytea)
RETURNS TABLE (key_id bigint, ring smallint, queues text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_key batonq.api_keys;
BEGIN
    SELECT * INTO v_key FROM batonq.api_keys k
     WHERE k.id = p_key_id AND k.secret_hash = p_secret_hash AND k.revoked_at IS NULL
       FOR SHARE;  -- a revoke_key at the same moment ends this session too
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF octet_length(p_token_hash) IS DISTINCT FROM 32 THEN
        PERFORM batonq._invalid_argument('a session token hash is 32 bytes (sha256)');
    END IF;
    INSERT INTO batonq.dashboard_sessions (token_hash, key_id, expires_at)
    VALUES (p_token_hash, v_key.id, now() + interval '12 hours');
    PERFORM batonq._key_used(v_key.id);
    RETURN QUERY SELECT v_key.id, v_key.ring, v_key.queues;
END $$;

-- The key behind a live session (the token whose sha256 is p_token_hash):
-- its id, ring and scopes as they are now; no row once the session expired
-- or ended, or its key was revoked.
CREATE OR REPLACE FUNCTION batonq.session_for_auth(p_token_hash bytea)
RETURNS TABLE (key_id bigint, ring smallint, queues text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_key record;
BEGIN
    SELECT k.id, k.ring, k.queues INTO v_key
      FROM batonq.dashboard_sessions s JOIN batonq.api_keys k ON k.id = s.key_id
     WHERE s.token_hash = p_token_hash AND s.expires_at > now() AND k.revoked_at IS NULL;
    IF FOUND THEN
        PERFORM batonq._key_used(v_key.id);
        RETURN QUERY SELECT v_key.id, v_key.ring, v_key.queues;
    END IF;
END $$;

-- Sign out: the session of the token whose sha256 is p_token_hash ends.
CREATE OR REPLACE FUNCTION batonq.end_session(p_token_hash bytea) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off
BEGIN ATOMIC
    WITH ended AS (DELETE FROM batonq.dashboard_sessions s WHERE s.token_hash = p_token_hash RETURNING 1)
    SELECT EXISTS (SELECT FROM ended);
END;

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
-- Keys and dashboard sessions are the service's (a worker's role that could
-- make a session for any key could act as that key on the dashboard).
REVOKE EXECUTE ON FUNCTION
    batonq.create_session(bigint, bytea, bytea), batonq.session_for_auth(bytea), batonq.end_session(bytea)
FROM batonq_worker;
GRANT EXECUTE ON FUNCTION
    batonq.create_key(integer, text[], text), batonq.key_for_auth(bigint), batonq.list_keys(),
    batonq.revoke_key(bigint), batonq.create_first_key(),
    batonq.create_session(bigint, bytea, bytea), batonq.session_for_auth(bytea), batonq.end_session(bytea)
TO batonq_service;
