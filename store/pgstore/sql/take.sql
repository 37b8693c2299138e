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
-- A key whose row holds blocks of leased tokens (migration 8) is
-- blocked: this statement decides and writes nothing, ok is false, and
-- the request goes to drip.block_apply (sql/blocks.sql), which decides it
-- under the blocks' cap (a sliding window reads such a row as no state,
-- as it reads a bucket's). Every write leaves a row without blocks.
WITH cur AS MATERIALIZED (
    SELECT b.tokens, b.ts, b.counts, b.ids IS NOT NULL AND $3::int <> 4 AS blocked
    FROM drip.buckets b WHERE b.key = $1::bytea FOR UPDATE OF b
),
d AS MATERIALIZED (
    SELECT i.now, i.late, i.blocked, i.ts AS b_ts, i.counts AS b_counts, e.*
    FROM (SELECT $2::int AS op, c.tokens IS NOT NULL AS present, c.tokens, c.ts, c.counts, $3::int AS kind, $4::bigint AS rate,
                 $5::bigint AS period, $6::bigint AS burst, $7::bigint AS maxres, $8::bigint AS start, $9::bigint AS cost,
                 $10::bool AS reserve, coalesce($11::bigint, drip.clock()) AS now,
                 {{LATE}} AS late, coalesce(c.blocked, false) AS blocked
          FROM (SELECT) one LEFT JOIN cur c ON true) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires, counts)
    SELECT $1::bytea, d.n_tokens, d.n_ts, d.expires, d.n_counts FROM d WHERE d.write AND NOT d.late AND NOT d.blocked
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires, counts = excluded.counts,
        ids = NULL, sizes = NULL, exps = NULL
    WHERE EXISTS (SELECT FROM cur)
    RETURNING 1
)
SELECT d.allowed, d.n_tokens, d.n_ts, d.now,
       NOT d.blocked AND (d.write AND NOT d.late) = EXISTS (SELECT FROM up) AS ok{{GO_COLUMNS}}
FROM d
