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
-- drip.lease_drop (sql/leases.sql) reads the leases with a fresh snapshot,
-- which holds those committed after this statement's own, before its lock.
del AS MATERIALIZED (
    SELECT drip.lease_drop(v.key) AS had FROM victims v
)
SELECT count(*) FROM del WHERE had
