-- batonq 0008: the engine's functions are the only door. The reader role
-- may read and wait for work (await_work); the worker role may also
-- enqueue, claim and write about its leases, and run the sweeper. Neither
-- has any table access; operator actions and queue settings stay with the
-- schema's owner.

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA batonq FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    batonq.get_task(bigint),
    batonq.set_aside_writes(bigint[]),
    batonq.list_tasks(text, text, integer, bigint),
    batonq.queue_stats(text, text, integer, text[]),
    batonq.list_queues(),
    batonq.await_work(text, double precision)
TO batonq_reader;

GRANT EXECUTE ON FUNCTION
    batonq.enqueue(text, jsonb, integer, double precision, integer, text, boolean, bigint),
    batonq.enqueue_many(text, jsonb[], text[], integer[], double precision[], integer, boolean, bigint),
    batonq.claim(text, text, integer, integer, bigint),
    batonq.heartbeat(text, integer, text),
    batonq.complete(text, jsonb),
    batonq.complete_many(text[], jsonb[]),
    batonq.fail(text, jsonb, double precision, boolean),
    batonq.release_lease(text),
    batonq.expire_leases(text, integer),
    batonq.sweep(),
    batonq.maintain()
TO batonq_worker;

INSERT INTO batonq.migrations (version, name) VALUES (8, 'grants');
