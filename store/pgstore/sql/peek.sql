-- peek.sql: the decision a request would get, as one SELECT that writes
-- nothing. Parameters as in take.sql, $2 (op) unused: the decision is
-- drip.eval's with op 1 (peek).
WITH p AS MATERIALIZED (
    SELECT $1::bytea AS key, $2::int AS op, $3::int AS kind, $4::bigint AS rate,
           $5::bigint AS period, $6::bigint AS burst, $7::bigint AS maxres,
           $8::bigint AS start, $9::bigint AS cost, $10::bool AS reserve,
           coalesce($11::bigint, drip.clock()) AS now
)
SELECT 'r' AS src, d.allowed, d.n_tokens, d.retry, d.reset
FROM p
LEFT JOIN drip.buckets b ON b.key = p.key
CROSS JOIN LATERAL drip.eval(1, b.key IS NOT NULL, b.tokens, b.ts, p.kind, p.rate,
                             p.period, p.burst, p.maxres, p.start, p.cost, p.reserve, p.now) d
