-- batonq 0008: the sweeper's leader is elected by a lease row, not a session
-- advisory lock. A transaction pooler (PgBouncer in transaction mode) hands
-- a server session to other clients between transactions: a session lock
-- taken through it is held by whichever client's server connection took it,
-- outlives the sweeper, and lets every sweeper lead. A row works through any
-- pooler (engine/leaders.sql).

-- One row per duty ('sweeper': sweep, schedules, maintenance; 'vacuum').
-- token grows by one each time the duty changes hands: a fencing token
-- numbering the leaders' terms.
CREATE TABLE batonq.leaders (
    duty       text PRIMARY KEY,
    holder     text NOT NULL,
    token      bigint NOT NULL,
    since      timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
REVOKE ALL ON batonq.leaders FROM PUBLIC;

INSERT INTO batonq.migrations (version, name) VALUES (8, 'leaders');
