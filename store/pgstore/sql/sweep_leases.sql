-- sweep_leases.sql: delete up to $1 keys of concurrency limits whose
-- leases all expired at least $2 ns ago by the server's clock (as
-- sweep.sql does for buckets): their rows in drip.leases and
-- drip.lease_holders, never waiting on a lock. Returns the number of keys
-- deleted.
WITH victims AS MATERIALIZED (
    SELECT l.key FROM drip.leases l
    WHERE l.expires <= drip.clock() - $2::bigint
    LIMIT $1::int
    FOR UPDATE OF l SKIP LOCKED
),
held AS (
    DELETE FROM drip.lease_holders h USING victims v WHERE h.key = v.key
),
del AS (
    DELETE FROM drip.leases l USING victims v WHERE l.key = v.key RETURNING 1
)
SELECT count(*) FROM del
