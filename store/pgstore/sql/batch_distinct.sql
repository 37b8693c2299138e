-- batch_distinct.sql: batch.sql for a batch whose keys are all distinct
-- (the common case on many keys): no per-key chains, so no recursion. Same
-- parameters and results as batch.sql; locking as in multi.sql, but each
-- request is written if it alone is allowed. A key with blocks of leased
-- tokens is decided under their cap, as in batch.sql.
WITH u AS MATERIALIZED (
    SELECT u.* FROM unnest($1::int[], $2::bytea[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[],
                   $7::bigint[], $8::bigint[], $9::bigint[], $10::bool[], $11::bigint[], $12::bigint[])
        WITH ORDINALITY AS u(op, key, kind, rate, period, burst, maxres, start, cost, reserve, at, dl, i)
),
cur AS MATERIALIZED (
    SELECT b.key, b.tokens, b.ts, b.counts, b.ids, b.sizes, b.exps, b.ids IS NOT NULL AND b.counts IS NULL AS blocks
    FROM drip.buckets b
    WHERE b.key IN (SELECT key FROM u)
    ORDER BY b.key
    FOR UPDATE OF b
),
-- The clock, read after the row locks (p depends on cur), as take.sql
-- does: a batch that waited on a lock decides at the time it got it.
p AS MATERIALIZED (
    SELECT drip.clock() AS clock FROM (SELECT count(*) FROM cur) locked
),
r AS MATERIALIZED (
    SELECT u.*, coalesce(u.at, p.clock) AS now
    FROM p, u
    WHERE NOT coalesce(p.clock >= u.dl, false)
),
-- d decides each request; k is its key's bucket as bucket.EvalBlocks
-- reads it: for a key with blocks (a sliding window's request excepted,
-- which reads such a row as no state), advanced through the expiries of
-- its blocks by drip.block_advance (sql/blocks.sql), with the blocks live
-- at now and their cap, the burst the request is decided under.
d AS MATERIALIZED (
    SELECT i.ord, i.key, i.now, i.ts AS b_ts, i.counts AS b_counts, i.kind, i.rate, i.period, i.cap, i.ids, i.sizes, i.exps, i.full_burst, e.*
    FROM (SELECT r.i AS ord, r.key, r.op, k.present, k.tokens, k.ts, c.counts,
                 r.kind, r.rate, r.period, k.cap AS burst, r.maxres, r.start, r.cost, r.reserve, r.now,
                 k.blocked, CASE WHEN k.blocked THEN k.cap END AS cap, k.ids, k.sizes, k.exps, r.burst AS full_burst
          FROM r LEFT JOIN cur c ON c.key = r.key
          CROSS JOIN LATERAL (
              SELECT true AS blocked, a.present, a.tokens, a.ts, a.ids, a.sizes, a.exps, a.cap
              FROM drip.block_advance(r.kind, r.rate, r.period, r.burst, r.maxres, r.start, true, c.tokens, c.ts,
                                      c.ids, c.sizes, c.exps, r.now) a
              WHERE coalesce(c.blocks, false) AND r.kind <> 4
              UNION ALL
              SELECT false, c.key IS NOT NULL, c.tokens, c.ts, NULL::text[], NULL::bigint[], NULL::bigint[], r.burst
              WHERE NOT (coalesce(c.blocks, false) AND r.kind <> 4)
          ) k) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
-- A key left with blocks keeps them, and expires as
-- drip.block_expires says; one left without has NULL ones.
w AS MATERIALIZED (
    SELECT key, n_tokens, n_ts,
           CASE WHEN cardinality(ids) > 0 THEN drip.block_expires(kind, rate, period, full_burst, n_tokens, n_ts, exps)
                ELSE expires END AS expires,
           n_counts,
           CASE WHEN cardinality(ids) > 0 THEN ids END AS ids,
           CASE WHEN cardinality(ids) > 0 THEN sizes END AS sizes,
           CASE WHEN cardinality(ids) > 0 THEN exps END AS exps
    FROM d WHERE write
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires, counts, ids, sizes, exps)
    SELECT key, n_tokens, n_ts, expires, n_counts, ids, sizes, exps FROM w ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires, counts = excluded.counts,
        ids = excluded.ids, sizes = excluded.sizes, exps = excluded.exps
    WHERE b.key IN (SELECT key FROM cur)
    RETURNING 1
)
SELECT d.ord, d.allowed, d.n_tokens, d.n_ts, d.now, false AS late, coalesce(d.b_ts, 0), d.b_counts, false AS blocked, d.cap
FROM d
WHERE drip.ensure((SELECT count(*) FROM up) = (SELECT count(*) FROM w))
UNION ALL
SELECT u.i, false, 0, 0, p.clock, true, 0, NULL::bigint[], false, NULL::bigint
FROM p, u WHERE u.i NOT IN (SELECT i FROM r)
ORDER BY 1
