-- batch.sql: many independent decisions (from concurrent callers) as one
-- statement. Each element is decided as if alone, in array order per key:
-- requests for the same key form a chain, each seeing the bucket the one
-- before left, and each bucket is written once, at the end.
--
-- One array per field: $1 ops, $2 keys, $3 kinds, $4 rates, $5 periods,
-- $6 bursts, $7 max reserved, $8 starts, $9 costs, $10 reserves, $11 times
-- in ns (NULL elements: the server's clock, read once per statement),
-- $12 deadlines in the server's clock, ns (NULL elements: none). A
-- sliding window's start is its number of slots (see slide.sql). Each row
-- of the result carries the stored state before its request (b_ts,
-- b_counts), from which Go recomputes a sliding window's decision.
--
-- A request whose deadline passed when the batch got its locks is late:
-- it is left out (neither decided nor written; the others are decided as
-- if it had never come) and answered with late set, and its caller, who
-- gave up on it, gets an error.
--
-- A request on a key whose row holds blocks of leased tokens (migration
-- 8; a sliding window's request excepted, which reads such a row as no
-- state) is decided here too, as bucket.EvalBlocks decides a plain
-- request: the bucket brought to its time through the expiries of the
-- blocks (drip.block_advance, sql/blocks.sql), then decided under the cap
-- of the blocks live (the burst less their sizes), which the row returns
-- (cap; NULL for a key without blocks) for Go to derive the times from.
-- A write keeps the blocks live (NULL when none is), and the row expires
-- as drip.block_expires says. A block's own take or return never comes
-- here (drip.block_apply decides it). So a hot key's takes stay batched
-- while instances hold blocks of it.
--
-- Locking as in multi.sql: existing buckets are locked in key order, so
-- batches never deadlock; a bucket that appeared after the locking read
-- makes drip.ensure raise 40001 and the batch is retried.
WITH RECURSIVE
u AS MATERIALIZED (
    SELECT u.* FROM unnest($1::int[], $2::bytea[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[],
                   $7::bigint[], $8::bigint[], $9::bigint[], $10::bool[], $11::bigint[], $12::bigint[])
        WITH ORDINALITY AS u(op, key, kind, rate, period, burst, maxres, start, cost, reserve, at, dl, i)
),
cur AS MATERIALIZED (
    SELECT b.key, b.tokens, b.ts, b.expires, b.counts, b.ids, b.sizes, b.exps,
           b.ids IS NOT NULL AND b.counts IS NULL AS blocks
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
    SELECT u.*, coalesce(u.at, p.clock) AS now,
           row_number() OVER (PARTITION BY u.key ORDER BY u.i) AS seq
    FROM p, u
    WHERE NOT coalesce(p.clock >= u.dl, false)
),
-- chain: one row per request, with the bucket after it (ex: a row exists;
-- st, ss, sx, sc, si, sz, se: its tokens, ts, expires, counts and blocks'
-- ids, sizes and exps), whether any step wrote, the row's ts and counts
-- before it (bts, bcounts), and the cap it was decided under (a key with
-- blocks: k, drip.block_advance's answer on the bucket before it).
chain (i, key, seq, allowed, tokens, ts, now, ex, st, ss, sx, sc, si, sz, se, dirty, bts, bcounts, cap) AS (
    SELECT r.i, r.key, r.seq, e.allowed, e.n_tokens, e.n_ts, r.now,
           e.write OR c.key IS NOT NULL,
           CASE WHEN e.write THEN e.n_tokens ELSE c.tokens END,
           CASE WHEN e.write THEN e.n_ts ELSE c.ts END,
           CASE WHEN NOT e.write THEN c.expires
                WHEN cardinality(k.ids) > 0 THEN drip.block_expires(r.kind, r.rate, r.period, r.burst, e.n_tokens, e.n_ts, k.ids_exps)
                ELSE e.expires END,
           CASE WHEN e.write THEN e.n_counts ELSE c.counts END,
           CASE WHEN NOT e.write THEN c.ids WHEN cardinality(k.ids) > 0 THEN k.ids END,
           CASE WHEN NOT e.write THEN c.sizes WHEN cardinality(k.ids) > 0 THEN k.sizes END,
           CASE WHEN NOT e.write THEN c.exps WHEN cardinality(k.ids) > 0 THEN k.ids_exps END,
           e.write, c.ts, c.counts, CASE WHEN k.blocked THEN k.cap END
    FROM r
    LEFT JOIN cur c ON c.key = r.key
    CROSS JOIN LATERAL (
        SELECT true AS blocked, a.present, a.tokens, a.ts, a.ids, a.sizes, a.exps AS ids_exps, a.cap
        FROM drip.block_advance(r.kind, r.rate, r.period, r.burst, r.maxres, r.start, true, c.tokens, c.ts,
                                c.ids, c.sizes, c.exps, r.now) a
        WHERE coalesce(c.blocks, false) AND r.kind <> 4
        UNION ALL
        SELECT false, c.key IS NOT NULL, c.tokens, c.ts, NULL::text[], NULL::bigint[], NULL::bigint[], r.burst
        WHERE NOT (coalesce(c.blocks, false) AND r.kind <> 4)
    ) k
    CROSS JOIN LATERAL (SELECT r.op, k.present, k.tokens, k.ts, c.counts, r.kind, r.rate,
                               r.period, k.cap AS burst, r.maxres, r.start, r.cost, r.reserve, r.now) i
    CROSS JOIN LATERAL ({{EVAL}}) e
    WHERE r.seq = 1
    UNION ALL
    SELECT r.i, r.key, r.seq, e.allowed, e.n_tokens, e.n_ts, r.now,
           e.write OR h.ex,
           CASE WHEN e.write THEN e.n_tokens ELSE h.st END,
           CASE WHEN e.write THEN e.n_ts ELSE h.ss END,
           CASE WHEN NOT e.write THEN h.sx
                WHEN cardinality(k.ids) > 0 THEN drip.block_expires(r.kind, r.rate, r.period, r.burst, e.n_tokens, e.n_ts, k.ids_exps)
                ELSE e.expires END,
           CASE WHEN e.write THEN e.n_counts ELSE h.sc END,
           CASE WHEN NOT e.write THEN h.si WHEN cardinality(k.ids) > 0 THEN k.ids END,
           CASE WHEN NOT e.write THEN h.sz WHEN cardinality(k.ids) > 0 THEN k.sizes END,
           CASE WHEN NOT e.write THEN h.se WHEN cardinality(k.ids) > 0 THEN k.ids_exps END,
           e.write OR h.dirty, h.ss, h.sc, CASE WHEN k.blocked THEN k.cap END
    FROM chain h
    JOIN r ON r.key = h.key AND r.seq = h.seq + 1
    CROSS JOIN LATERAL (
        SELECT true AS blocked, a.present, a.tokens, a.ts, a.ids, a.sizes, a.exps AS ids_exps, a.cap
        FROM drip.block_advance(r.kind, r.rate, r.period, r.burst, r.maxres, r.start, true, h.st, h.ss,
                                h.si, h.sz, h.se, r.now) a
        WHERE h.si IS NOT NULL AND h.sc IS NULL AND r.kind <> 4
        UNION ALL
        SELECT false, h.ex, h.st, h.ss, NULL::text[], NULL::bigint[], NULL::bigint[], r.burst
        WHERE NOT (h.si IS NOT NULL AND h.sc IS NULL AND r.kind <> 4)
    ) k
    CROSS JOIN LATERAL (SELECT r.op, k.present, k.tokens, k.ts, h.sc AS counts, r.kind, r.rate,
                               r.period, k.cap AS burst, r.maxres, r.start, r.cost, r.reserve, r.now) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
w AS MATERIALIZED (
    SELECT key, st, ss, sx, sc, si, sz, se FROM (
        SELECT DISTINCT ON (key) key, st, ss, sx, sc, si, sz, se, dirty FROM chain ORDER BY key, seq DESC
    ) last
    WHERE dirty
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires, counts, ids, sizes, exps)
    SELECT key, st, ss, sx, sc, si, sz, se FROM w ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires, counts = excluded.counts,
        ids = excluded.ids, sizes = excluded.sizes, exps = excluded.exps
    WHERE b.key IN (SELECT key FROM cur)
    RETURNING 1
)
SELECT c.i, c.allowed, c.tokens, c.ts, c.now, false AS late, coalesce(c.bts, 0), c.bcounts, false AS blocked, c.cap
FROM chain c
WHERE drip.ensure((SELECT count(*) FROM up) = (SELECT count(*) FROM w))
UNION ALL
SELECT u.i, false, 0, 0, p.clock, true, 0, NULL::bigint[], false, NULL::bigint
FROM p, u WHERE u.i NOT IN (SELECT i FROM r)
ORDER BY 1
