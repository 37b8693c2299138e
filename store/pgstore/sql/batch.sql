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
-- state) is blocked: left out as a late one is, and answered with blocked
-- set, for drip.block_apply to decide (see take.sql).
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
    SELECT b.key, b.tokens, b.ts, b.expires, b.counts, b.ids IS NOT NULL AS blocks
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
      AND NOT (u.kind <> 4 AND u.key IN (SELECT key FROM cur WHERE blocks))
),
-- chain: one row per request, with the bucket after it (ex: a row exists;
-- st, ss, sx, sc: its tokens, ts, expires, counts), whether any step
-- wrote, and the row's ts and counts before it (bts, bcounts).
chain (i, key, seq, allowed, tokens, ts, now, ex, st, ss, sx, sc, dirty, bts, bcounts) AS (
    SELECT r.i, r.key, r.seq, e.allowed, e.n_tokens, e.n_ts, r.now,
           e.write OR c.key IS NOT NULL,
           CASE WHEN e.write THEN e.n_tokens ELSE c.tokens END,
           CASE WHEN e.write THEN e.n_ts ELSE c.ts END,
           CASE WHEN e.write THEN e.expires ELSE c.expires END,
           CASE WHEN e.write THEN e.n_counts ELSE c.counts END,
           e.write, c.ts, c.counts
    FROM r
    LEFT JOIN cur c ON c.key = r.key
    CROSS JOIN LATERAL (SELECT r.op, c.key IS NOT NULL AS present, c.tokens, c.ts, c.counts, r.kind, r.rate,
                               r.period, r.burst, r.maxres, r.start, r.cost, r.reserve, r.now) i
    CROSS JOIN LATERAL ({{EVAL}}) e
    WHERE r.seq = 1
    UNION ALL
    SELECT r.i, r.key, r.seq, e.allowed, e.n_tokens, e.n_ts, r.now,
           e.write OR h.ex,
           CASE WHEN e.write THEN e.n_tokens ELSE h.st END,
           CASE WHEN e.write THEN e.n_ts ELSE h.ss END,
           CASE WHEN e.write THEN e.expires ELSE h.sx END,
           CASE WHEN e.write THEN e.n_counts ELSE h.sc END,
           e.write OR h.dirty, h.ss, h.sc
    FROM chain h
    JOIN r ON r.key = h.key AND r.seq = h.seq + 1
    CROSS JOIN LATERAL (SELECT r.op, h.ex AS present, h.st AS tokens, h.ss AS ts, h.sc AS counts, r.kind, r.rate,
                               r.period, r.burst, r.maxres, r.start, r.cost, r.reserve, r.now) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
w AS MATERIALIZED (
    SELECT key, st, ss, sx, sc FROM (
        SELECT DISTINCT ON (key) key, st, ss, sx, sc, dirty FROM chain ORDER BY key, seq DESC
    ) last
    WHERE dirty
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires, counts)
    SELECT key, st, ss, sx, sc FROM w ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires, counts = excluded.counts,
        ids = NULL, sizes = NULL, exps = NULL
    WHERE b.key IN (SELECT key FROM cur)
    RETURNING 1
)
SELECT c.i, c.allowed, c.tokens, c.ts, c.now, false AS late, coalesce(c.bts, 0), c.bcounts, false AS blocked
FROM chain c
WHERE drip.ensure((SELECT count(*) FROM up) = (SELECT count(*) FROM w))
UNION ALL
SELECT u.i, false, 0, 0, p.clock, coalesce(p.clock >= u.dl, false), 0, NULL::bigint[], NOT coalesce(p.clock >= u.dl, false)
FROM p, u WHERE u.i NOT IN (SELECT i FROM r)
ORDER BY 1
