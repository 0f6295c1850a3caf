-- batonq_service: the role `batonq serve` (and `batonq mcp`) may run as
-- instead of the schema's owner. A worker's functions, and those of the
-- service's work on behalf of its API keys: checking keys and dashboard
-- sessions, managing keys, settings, schedules and the graph, operator
-- actions. No table, no DDL: every call goes through the engine's
-- SECURITY DEFINER functions (the GRANTs in engine/*.sql), and row level
-- security hides the tables themselves (migrations/0010).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'batonq_service') THEN
        CREATE ROLE batonq_service NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

DO $$
BEGIN
    IF NOT pg_has_role('batonq_service', 'batonq_worker', 'MEMBER') THEN
        GRANT batonq_worker TO batonq_service;
    END IF;
END $$;

GRANT USAGE ON SCHEMA batonq TO batonq_service;

INSERT INTO batonq.migrations (version, name) VALUES (11, 'service_role');
