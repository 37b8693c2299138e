-- Migration 8: the blocks of leased tokens in their key's own row of
-- drip.buckets, as memory and Redis keep them: a leased instance and a
-- plain one on the same key share one bucket, and the blocks' cap holds
-- both (migration 7 kept a leased limit's state apart, a second bucket
-- per key: a fleet that mixed the two admitted up to twice the limit).
--
-- ids, sizes (micro-tokens) and exps (ns) are a key's blocks, one element
-- each, as drip.blocks held them: the blocks taken and neither returned
-- nor dropped yet (a decision that writes drops the expired ones; see
-- bucket.EvalBlocks). They are NULL for a key without blocks, the common
-- case: the plain statements (take.sql, batch.sql, multi.sql, peek.sql)
-- decide such rows alone, and leave a row with blocks to
-- drip.block_apply (sql/blocks.sql), which decides under the blocks' cap.
-- Every plain write of a row leaves them NULL. While a key has blocks,
-- expires is drip.block_expires: no earlier than the last block's expiry.
ALTER TABLE drip.buckets ADD COLUMN ids text[], ADD COLUMN sizes bigint[], ADD COLUMN exps bigint[];
-- The rows of drip.blocks move to drip.buckets. A key that had both a
-- plain bucket and a leased one keeps the lesser of their tokens at the
-- later of their times (never more than either would have refilled to)
-- and the leased one's blocks; its expires is unknown here (the
-- functions that compute it are installed after the migrations), so it
-- is the largest: the sweeper leaves the row until its next decision
-- writes the right one. A sliding window's row of the same key is
-- replaced, as a decision of the other kind replaces it.
INSERT INTO drip.buckets AS b (key, tokens, ts, expires, ids, sizes, exps)
SELECT k.key, k.tokens, k.ts, k.expires,
       CASE WHEN cardinality(k.ids) > 0 THEN k.ids END,
       CASE WHEN cardinality(k.ids) > 0 THEN k.sizes END,
       CASE WHEN cardinality(k.ids) > 0 THEN k.exps END
FROM drip.blocks k
ON CONFLICT (key) DO UPDATE
SET tokens = CASE WHEN b.counts IS NULL THEN least(b.tokens, excluded.tokens) ELSE excluded.tokens END,
    ts = CASE WHEN b.counts IS NULL THEN greatest(b.ts, excluded.ts) ELSE excluded.ts END,
    expires = CASE WHEN b.counts IS NULL THEN 9223372036854775807 ELSE excluded.expires END,
    counts = NULL, ids = excluded.ids, sizes = excluded.sizes, exps = excluded.exps;
DROP FUNCTION IF EXISTS drip.block_apply(int, bytea[], int[], bigint[], bigint[], bigint[], bigint[],
    bigint[], bigint[], bool[], text[], text[], bigint[], bool[], bigint, bigint);
DROP TABLE drip.blocks;
