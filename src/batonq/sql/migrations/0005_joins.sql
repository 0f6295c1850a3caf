-- batonq 0005: a join is resolved when it gathers, and only then
-- (engine/graph.sql): a join that died of an element, or was cancelled,
-- before gathering may come back when that element (or the join) is retried,
-- and keeps counting its elements meanwhile. Earlier, such a join was marked
-- resolved at once, and the elements that finished after it were not
-- counted. Those joins are unresolved here, with their count made again from
-- their finished elements -- where every element is still there to count; a
-- join whose elements retention already removed stays as it was. A join that
-- never gathered still holds the empty list it was made with.
WITH hot AS MATERIALIZED (
    SELECT t.join_task_id, count(*) AS n FROM batonq.tasks t
     WHERE t.join_task_id IS NOT NULL GROUP BY t.join_task_id
), stopped AS (
    SELECT j.join_task_id, j.expected,
           (SELECT count(*) FROM batonq.archive a WHERE a.join_task_id = j.join_task_id) AS finished
      FROM batonq.joins j
     WHERE j.resolved AND j.expected > 0
       AND EXISTS (SELECT FROM batonq.archive a
                    WHERE a.id = j.join_task_id AND a.state IN ('dead', 'cancelled')
                      AND a.payload = '[]'::jsonb)
)
UPDATE batonq.joins j SET resolved = false, finished = s.finished
  FROM stopped s LEFT JOIN hot h ON h.join_task_id = s.join_task_id
 WHERE j.join_task_id = s.join_task_id AND s.finished + coalesce(h.n, 0) = s.expected;

-- A join's row now goes with its join task (run_retention); the rows of
-- join tasks already gone go here.
DELETE FROM batonq.joins j
 WHERE NOT EXISTS (SELECT FROM batonq.tasks t WHERE t.id = j.join_task_id)
   AND NOT EXISTS (SELECT FROM batonq.archive a WHERE a.id = j.join_task_id);

INSERT INTO batonq.migrations (version, name) VALUES (5, 'joins');
