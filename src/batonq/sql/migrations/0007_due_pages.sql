-- The firer reads the due schedules page by page, by name
-- (engine/schedules.sql makes the new due_schedules).
DROP FUNCTION IF EXISTS batonq.due_schedules(integer);

INSERT INTO batonq.migrations (version, name) VALUES (7, 'due_pages');
