-- multi.sql: a multi-take (or multi-peek, multi-refund) as one statement,
-- all or nothing.
--
-- $1 op, then one array per field, one element per request (distinct
-- keys): $2 keys, $3 kinds, $4 rates, $5 periods, $6 bursts, $7 max
-- reserved, $8 starts, $9 costs, $10 reserves; $11 now in ns (NULL: the
-- server's clock); $12 the caller's deadline in the server's clock, ns
-- (NULL: none). A statement that got its locks after its deadline is late:
-- it writes nothing, and its caller, who gave up, gets an error.
--
-- cur locks the buckets that exist in key order (so multi-takes never
-- deadlock each other) and reads their latest versions; every decision is
-- computed from them; the new buckets are written only if every take is
-- allowed. A bucket that appeared after the locking read (a concurrent
-- first request) makes drip.ensure raise 40001: the statement rolls back and
-- the store retries it.
WITH r AS MATERIALIZED (
    SELECT * FROM unnest($2::bytea[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[],
                         $7::bigint[], $8::bigint[], $9::bigint[], $10::bool[])
        WITH ORDINALITY AS u(key, kind, rate, period, burst, maxres, start, cost, reserve, i)
),
cur AS MATERIALIZED (
    SELECT b.key, b.tokens, b.ts, b.expires
    FROM drip.buckets b
    WHERE b.key IN (SELECT key FROM r)
    ORDER BY b.key
    FOR UPDATE OF b
),
-- The clock, read after the row locks (p depends on cur), as take.sql
-- does: a statement that waited on a lock decides at the time it got it.
p AS MATERIALIZED (
    SELECT $1::int AS op, coalesce($11::bigint, drip.clock()) AS now,
           coalesce(drip.clock() >= $12::bigint, false) AS late
    FROM (SELECT count(*) FROM cur) locked
),
d AS MATERIALIZED (
    SELECT i.ord, i.key, e.*
    FROM (SELECT r.i AS ord, r.key, p.op, c.key IS NOT NULL AS present, c.tokens, c.ts,
                 r.kind, r.rate, r.period, r.burst, r.maxres, r.start, r.cost, r.reserve, p.now
          FROM p, r LEFT JOIN cur c ON c.key = r.key) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
w AS MATERIALIZED (
    SELECT d.key, d.n_tokens, d.n_ts, d.expires
    FROM d, p
    WHERE d.write AND NOT p.late AND (p.op <> 0 OR NOT EXISTS (SELECT FROM d d2 WHERE NOT d2.allowed))
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires)
    SELECT key, n_tokens, n_ts, expires FROM w ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires
    WHERE b.key IN (SELECT key FROM cur)
    RETURNING 1
)
SELECT d.allowed, d.n_tokens, d.n_ts, p.now, p.late
FROM d, p
WHERE drip.ensure((SELECT count(*) FROM up) = (SELECT count(*) FROM w))
ORDER BY d.ord
