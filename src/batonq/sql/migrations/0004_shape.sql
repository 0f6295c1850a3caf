-- The settings and the schedules of a page of queues are read for the
-- page's queues alone: list_queues and list_schedules take the queue names
-- (engine/operator.sql, engine/schedules.sql make the new ones).
DROP FUNCTION IF EXISTS batonq.list_queues();
DROP FUNCTION IF EXISTS batonq.list_schedules();

-- A page's schedules, found by their queues.
CREATE INDEX schedules_queue_idx ON batonq.schedules (queue);

INSERT INTO batonq.migrations (version, name) VALUES (4, 'shape');
