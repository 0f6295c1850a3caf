-- batonq 0013: a task carries its enqueuer's trace context.
--
-- trace_context is a W3C trace context carrier ({"traceparent": ...,
-- "tracestate": ...}) taken from the enqueuer's current span when the client
-- has OpenTelemetry, NULL otherwise. A claim returns it, so the worker's span
-- is the enqueuer's child in another process; a completion may replace it in
-- the archive with the context of the run that finished the task, which its
-- batons then carry, so one trace follows a task along the queue graph.
-- Nullable and without a default: adding it rewrites no row.

ALTER TABLE batonq.tasks ADD COLUMN trace_context jsonb;
ALTER TABLE batonq.archive ADD COLUMN trace_context jsonb;
ALTER TYPE batonq.lease ADD ATTRIBUTE trace_context jsonb;

-- Signatures that changed: the enqueues take the enqueuer's context, the
-- queue-first completions the run's, and the archive row both. CASCADE: the
-- SQL-language functions that call them (the token-only complete, ...) go
-- too; the engine, applied after the migrations, makes them all again.
DROP FUNCTION IF EXISTS batonq.enqueue(text, jsonb, integer, double precision, integer, text, boolean, bigint, text) CASCADE;
DROP FUNCTION IF EXISTS batonq.enqueue_deduped(text, jsonb, text, integer, double precision, integer, text) CASCADE;
DROP FUNCTION IF EXISTS batonq.enqueue_many(text, jsonb[], text[], integer[], double precision[], integer, boolean, bigint, text[]) CASCADE;
DROP FUNCTION IF EXISTS batonq.complete_in(text, text, jsonb) CASCADE;
DROP FUNCTION IF EXISTS batonq.complete_many_in(text, text[], jsonb[]) CASCADE;
DROP FUNCTION IF EXISTS batonq.complete_many(text[], jsonb[]) CASCADE;
DROP FUNCTION IF EXISTS batonq._archive_row(batonq.tasks, text, jsonb, text, jsonb) CASCADE;

INSERT INTO batonq.migrations (version, name) VALUES (13, 'trace_context');
