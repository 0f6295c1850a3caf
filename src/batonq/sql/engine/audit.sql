-- batonq engine: the audit of settings changes -- who changed a queue's
-- settings or a schedule, when, and from what to what.

-- Who changed a setting: the API key a service acts for (batonq._act_as),
-- else the database role that logged in (session_user: SECURITY DEFINER
-- functions run as their owner, so current_user would always name it).
CREATE OR REPLACE FUNCTION batonq._actor() RETURNS text
LANGUAGE sql STABLE
RETURN coalesce(nullif(current_setting('batonq.actor', true), ''), session_user::text);

-- Name who acts for the rest of this transaction (NULL: the database role).
CREATE OR REPLACE FUNCTION batonq._act_as(p_actor text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('batonq.actor', coalesce(p_actor, ''), true);
END $$;

-- A trigger, so that changes made any way are audited: by the client, by
-- an enqueue that creates its queue, by an UPDATE typed into psql.
-- Schedules' firing bookkeeping (next_tick, last_tick, last_task_id) is
-- not a setting and is left out.
CREATE OR REPLACE FUNCTION batonq._audit_settings() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_before jsonb := CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) - '{next_tick,last_tick,last_task_id}'::text[] END;
    v_after  jsonb := CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) - '{next_tick,last_tick,last_task_id}'::text[] END;
BEGIN
    IF v_before IS DISTINCT FROM v_after THEN
        INSERT INTO batonq.settings_audit (actor, kind, name, before, after)
        VALUES (batonq._actor(), TG_ARGV[0], coalesce(v_after, v_before) ->> 'name', v_before, v_after);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER queues_audit AFTER INSERT OR UPDATE OR DELETE ON batonq.queues
    FOR EACH ROW EXECUTE FUNCTION batonq._audit_settings('queue');

-- Not on the firer's moves (next_tick, last_tick, last_task_id, never
-- audited): ten thousand schedules due at once move in one update, and the
-- trigger would double its cost. A new column of settings is named here.
CREATE OR REPLACE TRIGGER schedules_audit
    AFTER INSERT OR UPDATE OF name, cron, tz, queue, payload, missed, paused, armed_at, created_at OR DELETE
    ON batonq.schedules
    FOR EACH ROW EXECUTE FUNCTION batonq._audit_settings('schedule');

-- The newest audit entries first, optionally of one kind and name; a page
-- ends before the entry before_id.
CREATE OR REPLACE FUNCTION batonq.list_settings_audit(
    p_kind text DEFAULT NULL, p_name text DEFAULT NULL, p_limit integer DEFAULT 50, p_before_id bigint DEFAULT NULL
) RETURNS SETOF batonq.settings_audit
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT * FROM batonq.settings_audit
     WHERE (p_kind IS NULL OR kind = p_kind) AND (p_name IS NULL OR name = p_name)
       AND (p_before_id IS NULL OR id < p_before_id)
     ORDER BY id DESC
     LIMIT least(greatest(p_limit, 1), 1000);
END;

-- A function is executable by PUBLIC when made: take that back. Reading
-- the audit is the service's and the owner's.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;
GRANT EXECUTE ON FUNCTION batonq.list_settings_audit(text, text, integer, bigint) TO batonq_service;
