-- batch_distinct.sql: batch.sql for a batch whose keys are all distinct
-- (the common case on many keys): no per-key chains, so no recursion. Same
-- parameters and results as batch.sql; locking as in multi.sql, but each
-- request is written if it alone is allowed.
WITH u AS MATERIALIZED (
    SELECT u.* FROM unnest($1::int[], $2::bytea[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[],
                   $7::bigint[], $8::bigint[], $9::bigint[], $10::bool[], $11::bigint[], $12::bigint[])
        WITH ORDINALITY AS u(op, key, kind, rate, period, burst, maxres, start, cost, reserve, at, dl, i)
),
cur AS MATERIALIZED (
    SELECT b.key, b.tokens, b.ts, b.counts, b.ids IS NOT NULL AS blocks
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
      AND NOT (u.kind <> 4 AND u.key IN (SELECT key FROM cur WHERE blocks))
),
d AS MATERIALIZED (
    SELECT i.ord, i.key, i.now, i.ts AS b_ts, i.counts AS b_counts, e.*
    FROM (SELECT r.i AS ord, r.key, r.op, c.key IS NOT NULL AS present, c.tokens, c.ts, c.counts,
                 r.kind, r.rate, r.period, r.burst, r.maxres, r.start, r.cost, r.reserve, r.now
          FROM r LEFT JOIN cur c ON c.key = r.key) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
w AS MATERIALIZED (
    SELECT key, n_tokens, n_ts, expires, n_counts FROM d WHERE write
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires, counts)
    SELECT key, n_tokens, n_ts, expires, n_counts FROM w ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires, counts = excluded.counts,
        ids = NULL, sizes = NULL, exps = NULL
    WHERE b.key IN (SELECT key FROM cur)
    RETURNING 1
)
SELECT d.ord, d.allowed, d.n_tokens, d.n_ts, d.now, false AS late, coalesce(d.b_ts, 0), d.b_counts, false AS blocked
FROM d
WHERE drip.ensure((SELECT count(*) FROM up) = (SELECT count(*) FROM w))
UNION ALL
SELECT u.i, false, 0, 0, p.clock, coalesce(p.clock >= u.dl, false), 0, NULL::bigint[], NOT coalesce(p.clock >= u.dl, false)
FROM p, u WHERE u.i NOT IN (SELECT i FROM r)
ORDER BY 1
