-- batonq engine: API keys for the HTTP service and the MCP server.
--
-- A key is bq_<id>_<secret>. Only sha256(secret) is stored; the key is
-- returned once, by create_key. A key has a ring (0 admin, 1 operator,
-- 2 worker, 3 observer: a ring-N key may do all that rings N..3 may) and
-- queue scopes (glob patterns such as 'shop:*'). No role gets these
-- functions: the service calls them as the schema's owner.

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

-- What the service needs to check a presented key: the stored hash (it
-- compares in constant time itself), ring and scopes. Marks the key used,
-- at most once a minute, so checking costs no write per request.
CREATE OR REPLACE FUNCTION batonq.key_for_auth(p_id bigint)
RETURNS TABLE (secret_hash bytea, ring smallint, queues text[], revoked boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
BEGIN
    UPDATE batonq.api_keys SET last_used_at = now()
     WHERE id = p_id AND revoked_at IS NULL
       AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');
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

-- A function is executable by PUBLIC when made: take that back, so the
-- grants below are the only door.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
