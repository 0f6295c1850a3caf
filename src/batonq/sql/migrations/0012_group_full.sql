-- batonq 0012: pending tasks of full groups leave the claim index.
--
-- A group-limited claim (group_max_leased) walks the claim index in claim
-- order and skips the tasks of groups at their limit. With thousands of
-- full groups, every claim read past all their tasks. Now the walk marks
-- what it read past as group_full, and the claim index leaves those rows
-- out, so the next claims do not read them again. A lease of the group that
-- ends gives them back, best first, as many as the group has room for (the
-- fold of the group's lease counts, engine/claim.sql); so does a change of
-- the queue's group_max_leased (all of them), and any change of the task's
-- state (a trigger). group_full is only ever true on a pending task.

ALTER TABLE batonq.tasks ADD COLUMN group_full boolean NOT NULL DEFAULT false;

DROP INDEX batonq.tasks_claim_idx;
CREATE INDEX tasks_claim_idx ON batonq.tasks (queue, priority DESC, run_at, id)
    WHERE state = 'pending' AND NOT group_full;

-- A group's set-aside tasks in claim order, for giving back the best first.
CREATE INDEX tasks_group_full_idx ON batonq.tasks (queue, group_key, priority DESC, run_at, id)
    WHERE group_full;

INSERT INTO batonq.migrations (version, name) VALUES (12, 'group_full');
