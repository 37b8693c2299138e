-- sweep_leases.sql: delete up to $1 rows of drip.leases whose leases all
-- expired at least $2 ns ago by the server's clock (as sweep.sql does for
-- buckets), never waiting on a lock. Returns the number deleted.
WITH victims AS (
    SELECT l.key FROM drip.leases l
    WHERE l.expires <= drip.clock() - $2::bigint
    LIMIT $1::int
    FOR UPDATE OF l SKIP LOCKED
),
del AS (
    DELETE FROM drip.leases l USING victims v WHERE l.key = v.key RETURNING 1
)
SELECT count(*) FROM del
