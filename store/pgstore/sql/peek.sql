-- peek.sql: the decision a request would get, as one SELECT that writes
-- (and locks) nothing. Parameters as in take.sql; the decision is
-- eval.sql's with op 1 (peek). For the Go store, GO_COLUMNS are the
-- stored state before (as in take.sql); for the SQL function, nothing.
-- A key whose row holds blocks is blocked, as in take.sql: ok is false.
SELECT e.allowed, e.n_tokens, e.n_ts, i.now, NOT i.blocked AS ok{{GO_COLUMNS}}
FROM (SELECT 1 AS op, b.key IS NOT NULL AS present, b.tokens, b.ts, b.counts,
             coalesce(b.ids IS NOT NULL AND $3::int <> 4, false) AS blocked, $3::int AS kind,
             $4::bigint AS rate, $5::bigint AS period, $6::bigint AS burst,
             $7::bigint AS maxres, $8::bigint AS start, $9::bigint AS cost,
             $10::bool AS reserve, coalesce($11::bigint, drip.clock()) AS now
      FROM (SELECT $1::bytea AS key, $2::int AS unused) k
      LEFT JOIN drip.buckets b ON b.key = k.key) i
CROSS JOIN LATERAL ({{EVAL}}) e
