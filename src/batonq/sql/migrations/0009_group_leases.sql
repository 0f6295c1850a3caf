-- batonq 0009: the leases each group holds, kept as they change, so a
-- group-limited claim looks a group's count up by key instead of counting
-- the queue's leases (engine/claim.sql: _pick_in_groups).
--
-- A change of a grouped task into or out of 'leased' adds a row of
-- batonq.group_lease_deltas (a trigger, engine/claim.sql: every path that
-- leases or ends a lease counts, whatever function it is in). Only inserts:
-- concurrent completes never wait on one another for a count. Whoever holds
-- a queue's limits lock (its claims; the sweep) folds the queue's deltas
-- into batonq.group_leases, so that table has one writer per queue and its
-- counts are exact under the lock.

CREATE TABLE batonq.group_leases (
    queue      text NOT NULL,
    group_key  text NOT NULL,
    leased     integer NOT NULL,
    PRIMARY KEY (queue, group_key)
);

CREATE TABLE batonq.group_lease_deltas (
    queue      text NOT NULL,
    group_key  text NOT NULL,
    n          integer NOT NULL
);

CREATE INDEX group_lease_deltas_queue_idx ON batonq.group_lease_deltas (queue);

-- The leases held now. (The trigger that keeps the counts is made by
-- engine/claim.sql; batonq migrate applies the migrations and the engine in
-- one transaction, and the lock keeps leases from starting or ending
-- between this count and the trigger's making until it commits. A block:
-- psql applying this file alone runs it outside a transaction.)
DO $$
BEGIN
    LOCK TABLE batonq.tasks IN SHARE ROW EXCLUSIVE MODE;
    INSERT INTO batonq.group_leases (queue, group_key, leased)
    SELECT queue, group_key, count(*) FROM batonq.tasks
     WHERE state = 'leased' AND group_key IS NOT NULL
     GROUP BY queue, group_key;
END $$;

-- New tables grant nothing to PUBLIC: only the engine's functions touch them.

INSERT INTO batonq.migrations (version, name) VALUES (9, 'group_leases');
