-- take.sql: one take or refund as one statement, in one round trip.
--
-- $1 key bytea, $2 op (0 take, 2 refund), $3 kind, $4 rate, $5 period,
-- $6 burst, $7 max reserved (-1: no bound), $8 window start, $9 cost (all
-- bigint micro-tokens and nanoseconds), $10 reserve, $11 now in ns (NULL:
-- the server's clock_timestamp()).
--
-- The INSERT proposes the bucket a fresh key would get; on a conflict the
-- stored bucket is refilled and charged by drip.eval, after its row lock is
-- taken, and written only WHERE the request is allowed: a denial writes
-- nothing. A denial returns no row from the INSERT, so the decision is then
-- computed from a locking read of the same row (the latest version, which
-- the INSERT has already locked). The caller never sends a request that a
-- fresh bucket would deny (it peeks instead), so a missing row is always
-- inserted. Source 'w' is a write, 'r' a denial; no row at all means the
-- row appeared after this statement's snapshot: run it again.
WITH p AS MATERIALIZED (
    SELECT $1::bytea AS key, $2::int AS op, $3::int AS kind, $4::bigint AS rate,
           $5::bigint AS period, $6::bigint AS burst, $7::bigint AS maxres,
           $8::bigint AS start, $9::bigint AS cost, $10::bool AS reserve,
           coalesce($11::bigint, drip.clock()) AS now
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires)
    SELECT p.key, f.n_tokens, f.n_ts, f.expires
    FROM p, drip.eval(p.op, false, 0, 0, p.kind, p.rate, p.period, p.burst,
                      p.maxres, p.start, p.cost, p.reserve, p.now) f
    ON CONFLICT (key) DO UPDATE
    SET (tokens, ts, expires) = (
        SELECT e.n_tokens, e.n_ts, e.expires
        FROM p, drip.eval(p.op, true, b.tokens, b.ts, p.kind, p.rate,
                          p.period, p.burst, p.maxres, p.start, p.cost, p.reserve, p.now) e)
    WHERE (
        SELECT e.write
        FROM p, drip.eval(p.op, true, b.tokens, b.ts, p.kind, p.rate,
                          p.period, p.burst, p.maxres, p.start, p.cost, p.reserve, p.now) e)
    RETURNING b.tokens, b.ts
),
cur AS (
    SELECT b.tokens, b.ts, b.expires
    FROM drip.buckets b, p
    WHERE b.key = p.key AND NOT EXISTS (SELECT FROM up)
    FOR UPDATE OF b
)
SELECT 'w' AS src, true AS allowed, up.tokens,
       CASE WHEN p.op = 2 THEN 0
            ELSE drip.until(p.kind, p.rate, p.period, up.tokens, up.ts, 0, p.now) END AS retry,
       drip.until(p.kind, p.rate, p.period, up.tokens, up.ts, p.burst, p.now) AS reset
FROM up, p
UNION ALL
SELECT 'r', d.allowed, d.n_tokens, d.retry, d.reset
FROM p, cur, drip.eval(p.op, true, cur.tokens, cur.ts, p.kind, p.rate,
                       p.period, p.burst, p.maxres, p.start, p.cost, p.reserve, p.now) d
