-- sweep.sql: delete the idle buckets among the next $2 keys after $1: those
-- that expired (were full again) at least $3 ns ago by the server's clock,
-- a margin within which a decision made with a clock that went back a
-- little still sees the bucket's own ts. It never waits on a lock: rows
-- that decisions hold are skipped (they are in use). Returns the last key
-- of the page (NULL at the end of the table) and the number deleted.
WITH page AS MATERIALIZED (
    SELECT key FROM drip.buckets WHERE key > $1::bytea ORDER BY key LIMIT $2::int
),
victims AS (
    SELECT b.key FROM drip.buckets b
    WHERE b.key IN (SELECT key FROM page) AND b.expires <= drip.clock() - $3::bigint
      -- A key's leases older than its row (drip.lease_read counts none of
      -- them) would count again without it: the row stays while they live.
      AND NOT EXISTS (SELECT FROM drip.leases l WHERE l.key = b.key AND l.expires > drip.clock() - $3::bigint)
    FOR UPDATE OF b SKIP LOCKED
),
del AS (
    DELETE FROM drip.buckets b USING victims v WHERE b.key = v.key RETURNING 1
)
SELECT (SELECT key FROM page ORDER BY key DESC LIMIT 1), (SELECT count(*) FROM del)
