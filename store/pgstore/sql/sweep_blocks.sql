-- sweep_blocks.sql: delete up to $1 rows of leased limits (drip.blocks)
-- that carry no information since at least $2 ns ago by the server's
-- clock (every block expired and the bucket full again: see migration
-- 7), as sweep.sql does for buckets, never waiting on a lock. Returns the
-- number deleted.
WITH victims AS MATERIALIZED (
    SELECT b.key FROM drip.blocks b
    WHERE b.expires <= drip.clock() - $2::bigint
    LIMIT $1::int
    FOR UPDATE OF b SKIP LOCKED
),
del AS (
    DELETE FROM drip.blocks b USING victims v WHERE b.key = v.key RETURNING 1
)
SELECT count(*) FROM del
