-- Dashboard sessions (engine/keys.sql): the dashboard's cookie holds a
-- random token, never the API key; only sha256(token) is stored. A session
-- lasts until it expires, its user signs out, or its key is revoked.
CREATE TABLE batonq.dashboard_sessions (
    token_hash  bytea PRIMARY KEY,
    key_id      bigint NOT NULL REFERENCES batonq.api_keys (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

-- Revoking a key ends its sessions; retention removes the expired ones.
CREATE INDEX dashboard_sessions_key_idx ON batonq.dashboard_sessions (key_id);
CREATE INDEX dashboard_sessions_expires_idx ON batonq.dashboard_sessions (expires_at);

-- Nothing but the engine's functions may touch it.
REVOKE ALL ON batonq.dashboard_sessions FROM PUBLIC;

-- A run's lineage is read a page at a time: run_tasks takes a limit
-- (engine/graph.sql makes the new one).
DROP FUNCTION IF EXISTS batonq.run_tasks(bigint);

INSERT INTO batonq.migrations (version, name) VALUES (6, 'sessions');
