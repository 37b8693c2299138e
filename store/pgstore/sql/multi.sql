-- multi.sql: a multi-take (or multi-peek, multi-refund) as one statement,
-- all or nothing.
--
-- $1 op, then one array per field, one element per request (distinct
-- keys): $2 keys, $3 kinds, $4 rates, $5 periods, $6 bursts, $7 max
-- reserved, $8 starts (a sliding window's: its number of slots), $9
-- costs, $10 reserves; $11 now in ns (NULL: the
-- server's clock); $12 the caller's deadline in the server's clock, ns
-- (NULL: none); $13 leases (the lease ID of a request on a concurrency
-- limit, kind 3, whose state is its rows in drip.leases and
-- drip.lease_holders; '' otherwise). A statement that got its locks
-- after its deadline is late: it writes nothing, and its caller, who gave
-- up, gets an error.
--
-- cur locks the buckets that exist in key order (so multi-takes never
-- deadlock each other) and reads their latest versions; every decision is
-- computed from them; the new buckets are written only if every take is
-- allowed. A bucket that appeared after the locking read (a concurrent
-- first request) makes drip.ensure raise 40001: the statement rolls back and
-- the store retries it. Requests on concurrency limits (kind 3) lock their
-- keys' rows of drip.leases the same way, after the buckets (so the order
-- of locks is the same in every statement), and read what bucket.Leases
-- summarizes (live leases, whether the request's lease is among them, the
-- earliest and latest expiry; sql/leases.sql): the verdict is
-- bucket.Params.EvalLeases's, and the Go store checks it. All or nothing
-- holds across both kinds. A request on a key whose row holds blocks of
-- leased tokens (migration 8; a sliding window's excepted, which reads
-- such a row as no state) is decided here too, as batch.sql decides it:
-- under the cap of its live blocks after drip.block_advance
-- (sql/blocks.sql), returned as cap (NULL for a key without blocks), the
-- write keeping the blocks live.
WITH r AS MATERIALIZED (
    SELECT * FROM unnest($2::bytea[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[],
                         $7::bigint[], $8::bigint[], $9::bigint[], $10::bool[], $13::text[])
        WITH ORDINALITY AS u(key, kind, rate, period, burst, maxres, start, cost, reserve, lease, i)
),
cur AS MATERIALIZED (
    SELECT b.key, b.tokens, b.ts, b.expires, b.counts, b.ids, b.sizes, b.exps,
           b.ids IS NOT NULL AND b.counts IS NULL AS blocks
    FROM drip.buckets b
    WHERE b.key IN (SELECT key FROM r WHERE kind <> 3)
    ORDER BY b.key
    FOR UPDATE OF b
),
lcur AS MATERIALIZED (
    SELECT l.key
    FROM drip.leases l
    WHERE l.key IN (SELECT key FROM r WHERE kind = 3)
    ORDER BY l.key
    FOR UPDATE OF l
),
-- The clock, read after the row locks (p depends on cur), as take.sql
-- does: a statement that waited on a lock decides at the time it got it.
p AS MATERIALIZED (
    SELECT $1::int AS op, coalesce($11::bigint, drip.clock()) AS now,
           coalesce(drip.clock() >= $12::bigint, false) AS late
    FROM (SELECT count(*) FROM cur) locked, (SELECT count(*) FROM lcur) llocked
),
-- d: the bucket requests, each decided on its key's bucket (k: for a key
-- with blocks, drip.block_advance's answer, under whose cap it is
-- decided; as batch.sql's chain)
d AS MATERIALIZED (
    SELECT i.ord, i.key, i.b_ts, i.counts AS b_counts, i.kind AS b_kind, i.rate AS b_rate,
           i.period AS b_period, i.full_burst AS b_burst, i.cap, i.ids, i.sizes, i.exps, e.*
    FROM (SELECT r.i AS ord, r.key, p.op, k.present, k.tokens, k.ts, c.ts AS b_ts, c.counts,
                 r.kind, r.rate, r.period, k.cap AS burst, r.burst AS full_burst, r.maxres, r.start, r.cost,
                 r.reserve, p.now, CASE WHEN k.decided THEN k.cap END AS cap, k.ids, k.sizes, k.exps
          FROM p CROSS JOIN r LEFT JOIN cur c ON c.key = r.key
          CROSS JOIN LATERAL (
              SELECT true AS decided, a.present, a.tokens, a.ts, a.ids, a.sizes, a.exps, a.cap
              FROM drip.block_advance(r.kind, r.rate, r.period, r.burst, r.maxres, r.start, true, c.tokens, c.ts,
                                      c.ids, c.sizes, c.exps, p.now) a
              WHERE coalesce(c.blocks, false) AND r.kind <> 4
              UNION ALL
              SELECT false, c.key IS NOT NULL, c.tokens, c.ts, NULL::text[], NULL::bigint[], NULL::bigint[], r.burst
              WHERE NOT (coalesce(c.blocks, false) AND r.kind <> 4)
          ) k
          WHERE r.kind <> 3) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
-- The requests on concurrency limits: bucket.Leases (drip.lease_read, in
-- sql/leases.sql: its queries read a fresh snapshot, taken after lcur's
-- locks), then the verdict of bucket.Params.EvalLeases (a release is
-- always allowed; a take or peek if its lease is live or a slot is free).
ld AS MATERIALIZED (
    SELECT r.i AS ord, r.key, r.lease, r.period, s.*,
           (p.op = 2 OR s.held OR s.live < r.burst / 1000000) AS allowed
    FROM p, r CROSS JOIN LATERAL drip.lease_read(r.key, r.lease, p.now) s
    WHERE r.kind = 3
),
-- all: every request is allowed (a take writes only then)
ok AS MATERIALIZED (
    SELECT NOT EXISTS (SELECT FROM d WHERE NOT d.allowed) AND NOT EXISTS (SELECT FROM ld WHERE NOT ld.allowed) AS everyone
),
-- w: the buckets to write; a key's live blocks stay (NULL when none is),
-- and its row expires as drip.block_expires says
w AS MATERIALIZED (
    SELECT d.key, d.n_tokens, d.n_ts,
           CASE WHEN cardinality(d.ids) > 0
                THEN drip.block_expires(d.b_kind, d.b_rate, d.b_period, d.b_burst, d.n_tokens, d.n_ts, d.exps)
                ELSE d.expires END AS expires,
           d.n_counts,
           CASE WHEN cardinality(d.ids) > 0 THEN d.ids END AS ids,
           CASE WHEN cardinality(d.ids) > 0 THEN d.sizes END AS sizes,
           CASE WHEN cardinality(d.ids) > 0 THEN d.exps END AS exps
    FROM d, p, ok
    WHERE d.write AND NOT p.late AND (p.op <> 0 OR ok.everyone)
),
-- The leases to write (drip.lease_write, bucket.Params.NextLeases): the
-- expired ones dropped, then the request's lease acquired or renewed (a
-- take) or released (a refund). A release of a key without a row writes
-- none. lease_write is false when a first acquire found the key's row
-- made by a concurrent statement: then drip.ensure below raises 40001 and
-- the statement is run again.
lup AS MATERIALIZED (
    SELECT drip.lease_write(p.op, ld.key, ld.lease, ld.period, p.now, ld.present) AS ok
    FROM p, ok, ld
    WHERE NOT p.late AND ((p.op = 2 AND ld.present) OR (p.op = 0 AND ok.everyone))
    ORDER BY ld.key
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires, counts, ids, sizes, exps)
    SELECT key, n_tokens, n_ts, expires, n_counts, ids, sizes, exps FROM w ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires, counts = excluded.counts,
        ids = excluded.ids, sizes = excluded.sizes, exps = excluded.exps
    WHERE b.key IN (SELECT key FROM cur)
    RETURNING 1
)
SELECT x.allowed, x.n_tokens, x.n_ts, p.now, p.late, x.live, x.held, x.earliest, x.latest, x.b_ts, x.b_counts, x.cap
FROM (SELECT d.ord, d.allowed, d.n_tokens, d.n_ts, 0::bigint AS live, false AS held, 0::bigint AS earliest, 0::bigint AS latest,
             coalesce(d.b_ts, 0) AS b_ts, d.b_counts, d.cap FROM d
      UNION ALL
      SELECT ld.ord, ld.allowed, 0, 0, ld.live, ld.held, ld.earliest, ld.latest, 0, NULL::bigint[], NULL::bigint FROM ld) x, p
WHERE drip.ensure((SELECT count(*) FROM up) = (SELECT count(*) FROM w) AND (SELECT coalesce(bool_and(lup.ok), true) FROM lup))
ORDER BY x.ord
