-- Row level security on every batonq table, with no policy: a role that
-- is granted a table anyway (a REST layer's anon or authenticated roles,
-- once the schema is exposed to them) reads and writes no row of it. The
-- engine's functions run as the tables' owner, whom row level security
-- does not bind (ENABLE, not FORCE), so batonq_worker and batonq_reader
-- work as before. Partitions are tables of their own: each gets it too
-- (batonq.ensure_partitions enables it on the ones it makes later).
DO $$
DECLARE
    v_table regclass;
BEGIN
    FOR v_table IN
        SELECT c.oid::regclass FROM pg_class c
         WHERE c.relnamespace = 'batonq'::regnamespace AND c.relkind IN ('r', 'p')
         ORDER BY c.oid
    LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', v_table);
    END LOOP;
END $$;

INSERT INTO batonq.migrations (version, name) VALUES (10, 'row_security');
