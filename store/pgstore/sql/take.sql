-- take.sql: one take or refund as one statement, in one round trip.
--
-- $1 key bytea, $2 op (0 take, 2 refund), $3 kind, $4 rate, $5 period,
-- $6 burst, $7 max reserved (-1: no bound), $8 window start, $9 cost (all
-- bigint micro-tokens and nanoseconds), $10 reserve, $11 now in ns (NULL:
-- the server's clock_timestamp()); for the Go store, $12 its caller's
-- deadline in the server's clock, ns (NULL: none). For a sliding window
-- (kind 4), $8 is its number of slots (see slide.sql).
--
-- cur locks the key's row, if any, and reads its latest version (a statement
-- that waited on the lock sees what the one before it wrote); d then reads
-- the clock (after the lock, so time never runs backwards between two
-- statements on one key) and decides, once, with the math of eval.sql; the
-- INSERT ... ON CONFLICT DO UPDATE writes the new bucket only if the
-- request is allowed: a denial writes nothing. Its WHERE lets it update only the row that cur locked: if the
-- key had no row and a concurrent statement inserted one in the meantime,
-- nothing is written and ok is false, and the caller runs the statement
-- again. A request whose deadline passed when it got the lock is late:
-- nothing is written, and the Go store answers it with an error (its
-- caller gave up on it). The SQL functions have no deadline: the
-- installer puts false in place of the LATE marker and nothing in place
-- of GO_COLUMNS, which for the Go store are late and the stored state
-- before the decision (b_ts, b_counts: a sliding window's, from which Go
-- recomputes the decision with bucket.EvalSliding). (Deciding in the DO UPDATE's SET and WHERE instead would run the
-- math three times: for the proposed fresh row, the WHERE and the SET.)
-- A key whose row holds blocks of leased tokens (migration 8; a sliding
-- window reads such a row as no state, as it reads a bucket's) is, for
-- the Go store ({{BLOCKS}} true), decided as batch.sql decides it: under
-- the cap of its live blocks after drip.block_advance (sql/blocks.sql),
-- returned as cap, the write keeping the blocks live. For the SQL
-- function ({{BLOCKS}} false) it is blocked: this statement decides and
-- writes nothing, ok is false, and the request goes to drip.block_apply,
-- which decides it under the blocks' cap.
WITH cur AS MATERIALIZED (
    SELECT b.tokens, b.ts, b.counts, b.ids, b.sizes, b.exps,
           b.ids IS NOT NULL AND b.counts IS NULL AND $3::int <> 4 AS blocks
    FROM drip.buckets b WHERE b.key = $1::bytea FOR UPDATE OF b
),
d AS MATERIALIZED (
    SELECT i.now, i.late, i.blocked, i.ts AS b_ts, i.counts AS b_counts, i.cap, i.ids, i.sizes, i.exps, e.*
    FROM (SELECT $2::int AS op, k.present, k.tokens, k.ts, c.counts, $3::int AS kind, $4::bigint AS rate,
                 $5::bigint AS period, k.cap AS burst, $7::bigint AS maxres, $8::bigint AS start, $9::bigint AS cost,
                 $10::bool AS reserve, k.now,
                 {{LATE}} AS late, coalesce(c.blocks, false) AND NOT {{BLOCKS}} AS blocked,
                 CASE WHEN k.decided THEN k.cap END AS cap, k.ids, k.sizes, k.exps
          FROM (SELECT) one
          LEFT JOIN cur c ON true
          -- the clock, read after the lock (t depends on c)
          CROSS JOIN LATERAL (SELECT coalesce($11::bigint, drip.clock()) AS now, c.ts AS locked OFFSET 0) t
          CROSS JOIN LATERAL (
              SELECT true AS decided, a.present, a.tokens, a.ts, a.ids, a.sizes, a.exps, a.cap, t.now
              FROM drip.block_advance($3::int, $4::bigint, $5::bigint, $6::bigint, $7::bigint, $8::bigint, true,
                                      c.tokens, c.ts, c.ids, c.sizes, c.exps, t.now) a
              WHERE coalesce(c.blocks, false) AND {{BLOCKS}}
              UNION ALL
              SELECT false, c.tokens IS NOT NULL, c.tokens, c.ts, NULL::text[], NULL::bigint[], NULL::bigint[], $6::bigint, t.now
              WHERE NOT (coalesce(c.blocks, false) AND {{BLOCKS}})
          ) k) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires, counts, ids, sizes, exps)
    SELECT $1::bytea, d.n_tokens, d.n_ts,
           CASE WHEN cardinality(d.ids) > 0 THEN drip.block_expires($3::int, $4::bigint, $5::bigint, $6::bigint, d.n_tokens, d.n_ts, d.exps)
                ELSE d.expires END,
           d.n_counts,
           CASE WHEN cardinality(d.ids) > 0 THEN d.ids END,
           CASE WHEN cardinality(d.ids) > 0 THEN d.sizes END,
           CASE WHEN cardinality(d.ids) > 0 THEN d.exps END
    FROM d WHERE d.write AND NOT d.late AND NOT d.blocked
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires, counts = excluded.counts,
        ids = excluded.ids, sizes = excluded.sizes, exps = excluded.exps
    WHERE EXISTS (SELECT FROM cur)
    RETURNING 1
)
SELECT d.allowed, d.n_tokens, d.n_ts, d.now,
       NOT d.blocked AND (d.write AND NOT d.late) = EXISTS (SELECT FROM up) AS ok{{GO_COLUMNS}}
FROM d
