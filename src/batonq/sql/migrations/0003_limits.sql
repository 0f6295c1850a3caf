-- batonq 0003: concurrency and rate limits. A queue may cap the tasks leased
-- at once (max_leased), those leased per group (group_max_leased: tasks carry
-- an optional group, e.g. a customer id), its claims per period (rate_limit
-- per rate_period_s, a token bucket) and each group's claims per period
-- (group_rate_limit per rate_period_s, a bucket per group). The claim
-- enforces them (engine/claim.sql).

-- SQL-bodied functions that take or return the rows changed below depend
-- on their row types, which then cannot change: dropped here, made again by
-- the engine files. (IF EXISTS: a fresh database has no functions yet.)
DROP FUNCTION IF EXISTS batonq.run_tasks(bigint);
DROP FUNCTION IF EXISTS batonq.dead_tasks(text[], text, text, integer, bigint);
DROP FUNCTION IF EXISTS batonq._backoff_s(batonq.queues, integer);
DROP FUNCTION IF EXISTS batonq._archive_row(batonq.tasks, text, jsonb, text, jsonb);
DROP FUNCTION IF EXISTS batonq._hot_view(batonq.tasks);
DROP FUNCTION IF EXISTS batonq._archive_view(batonq.archive);

ALTER TABLE batonq.queues
    ADD COLUMN max_leased integer CHECK (max_leased >= 1),
    ADD COLUMN group_max_leased integer CHECK (group_max_leased >= 1),
    ADD COLUMN rate_limit integer CHECK (rate_limit >= 1),
    ADD COLUMN group_rate_limit integer CHECK (group_rate_limit >= 1),
    ADD COLUMN rate_period_s double precision NOT NULL DEFAULT 1
        CHECK (rate_period_s > 0 AND rate_period_s <= 86400);

-- The group a task counts against (shown to users as "group"). Its length
-- is checked by the enqueues (batonq._check_group).
ALTER TABLE batonq.tasks ADD COLUMN group_key text;
ALTER TABLE batonq.archive ADD COLUMN group_key text;

-- The leased tasks of a queue per group: a group-limited claim counts them.
-- Partial on leased rows, so it stays as small as the leases held.
CREATE INDEX tasks_leased_group_idx ON batonq.tasks (queue, group_key)
    WHERE state = 'leased' AND group_key IS NOT NULL;

-- Each rate-limited queue's token bucket: the tokens it held at "at". A
-- table apart from batonq.queues, so a claim's refill is neither a settings
-- change (audited) nor a lock on the queue's settings row. Made full by the
-- first claim after the rate was set.
CREATE TABLE batonq.rate_buckets (
    queue   text PRIMARY KEY,
    tokens  double precision NOT NULL,
    at      timestamptz NOT NULL
);

-- Each group's token bucket in a queue with group_rate_limit, kept as one
-- time: "full_at", when the bucket is full again (each token taken moves it
-- rate_period_s / group_rate_limit later; engine/claim.sql). A table apart
-- from rate_buckets, not a wider one: the queue's bucket is one row read by
-- its key on every claim, and a group column in its key would need a
-- stand-in for "the whole queue". A missing row is a full bucket: a claim
-- makes the rows of the groups it takes from, and the maintenance removes
-- the full ones (full_at passed), so the table holds the groups claimed from
-- lately, not every group ever seen.
CREATE TABLE batonq.group_rate_buckets (
    queue      text NOT NULL,
    group_key  text NOT NULL,
    full_at    timestamptz NOT NULL,
    PRIMARY KEY (queue, group_key)
);

-- The empty buckets of a queue are those full latest (full_at beyond
-- now + (group_rate_limit - 1) tokens' time): a claim skips their groups
-- and rate_wait_s reads their soonest token, without reading the others.
CREATE INDEX group_rate_buckets_full_at_idx ON batonq.group_rate_buckets (queue, full_at);

ALTER TYPE batonq.task_view ADD ATTRIBUTE "group" text;
ALTER TYPE batonq.lease ADD ATTRIBUTE "group" text;

-- Signatures that changed: the enqueues take a group, configure_queue the
-- limits and the auditing actor (configure_queue_as is folded into it).
DROP FUNCTION IF EXISTS batonq.enqueue(text, jsonb, integer, double precision, integer, text, boolean, bigint);
DROP FUNCTION IF EXISTS batonq.enqueue_many(text, jsonb[], text[], integer[], double precision[], integer, boolean, bigint);
DROP FUNCTION IF EXISTS batonq.enqueue_debounced(text, text, jsonb, double precision, double precision, text, integer, integer);
DROP FUNCTION IF EXISTS batonq.configure_queue_as(text, text, integer, integer, double precision, double precision, integer, integer, boolean);
-- _result_limit became _submit_settings (the limit and whether the queue's
-- concurrency is limited, in one look).
DROP FUNCTION IF EXISTS batonq._result_limit(text);
DROP FUNCTION IF EXISTS batonq.configure_queue(text, integer, integer, double precision, double precision, integer, integer, boolean);

-- New tables grant nothing to PUBLIC: only the engine's functions touch them.

INSERT INTO batonq.migrations (version, name) VALUES (3, 'limits');
