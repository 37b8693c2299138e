-- peek.sql: the decision a request would get, as one SELECT that writes
-- (and locks) nothing. Parameters as in take.sql; the decision is
-- eval.sql's with op 1 (peek). For the Go store, GO_COLUMNS are the
-- stored state before (as in take.sql) and the cap; for the SQL
-- function, nothing.
-- A key whose row holds blocks is decided as take.sql decides it: for
-- the Go store ({{BLOCKS}} true) under the cap of its live blocks after
-- drip.block_advance, returned as cap; for the SQL function ({{BLOCKS}}
-- false) it is blocked: ok is false.
SELECT e.allowed, e.n_tokens, e.n_ts, i.now, NOT i.blocked AS ok{{GO_COLUMNS}}
FROM (SELECT 1 AS op, k.present, k.tokens, k.ts, b.ts AS b_ts, b.counts,
             coalesce(b.blocks, false) AND NOT {{BLOCKS}} AS blocked, $3::int AS kind,
             $4::bigint AS rate, $5::bigint AS period, k.cap AS burst,
             $7::bigint AS maxres, $8::bigint AS start, $9::bigint AS cost,
             $10::bool AS reserve, t.now, CASE WHEN k.decided THEN k.cap END AS cap
      FROM (SELECT $1::bytea AS key, $2::int AS unused, coalesce($11::bigint, drip.clock()) AS now) t
      LEFT JOIN (SELECT b.*, b.ids IS NOT NULL AND b.counts IS NULL AND $3::int <> 4 AS blocks
                 FROM drip.buckets b) b ON b.key = t.key
      CROSS JOIN LATERAL (
          SELECT true AS decided, a.present, a.tokens, a.ts, a.cap
          FROM drip.block_advance($3::int, $4::bigint, $5::bigint, $6::bigint, $7::bigint, $8::bigint, true,
                                  b.tokens, b.ts, b.ids, b.sizes, b.exps, t.now) a
          WHERE coalesce(b.blocks, false) AND {{BLOCKS}}
          UNION ALL
          SELECT false, b.key IS NOT NULL, b.tokens, b.ts, $6::bigint
          WHERE NOT (coalesce(b.blocks, false) AND {{BLOCKS}})
      ) k) i
CROSS JOIN LATERAL ({{EVAL}}) e
