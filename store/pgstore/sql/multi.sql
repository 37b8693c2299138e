-- multi.sql: a multi-take (or multi-peek, multi-refund) as one statement,
-- all or nothing.
--
-- $1 op, then one array per field, one element per request (distinct
-- keys): $2 keys, $3 kinds, $4 rates, $5 periods, $6 bursts, $7 max
-- reserved, $8 starts, $9 costs, $10 reserves; $11 now in ns (NULL: the
-- server's clock); $12 the caller's deadline in the server's clock, ns
-- (NULL: none); $13 leases (the lease ID of a request on a concurrency
-- limit, kind 3, whose state is a row of drip.leases; '' otherwise). A statement that got its locks after its deadline is late:
-- it writes nothing, and its caller, who gave up, gets an error.
--
-- cur locks the buckets that exist in key order (so multi-takes never
-- deadlock each other) and reads their latest versions; every decision is
-- computed from them; the new buckets are written only if every take is
-- allowed. A bucket that appeared after the locking read (a concurrent
-- first request) makes drip.ensure raise 40001: the statement rolls back and
-- the store retries it. Requests on concurrency limits (kind 3) lock their
-- rows of drip.leases the same way, after the buckets (so the order of
-- locks is the same in every statement), and count in them what
-- bucket.Leases summarizes (live leases, whether the request's lease is
-- among them, the earliest and latest expiry): the verdict is
-- bucket.Params.EvalLeases's, and the Go store checks it. All or nothing
-- holds across both kinds.
WITH r AS MATERIALIZED (
    SELECT * FROM unnest($2::bytea[], $3::int[], $4::bigint[], $5::bigint[], $6::bigint[],
                         $7::bigint[], $8::bigint[], $9::bigint[], $10::bool[], $13::text[])
        WITH ORDINALITY AS u(key, kind, rate, period, burst, maxres, start, cost, reserve, lease, i)
),
cur AS MATERIALIZED (
    SELECT b.key, b.tokens, b.ts, b.expires
    FROM drip.buckets b
    WHERE b.key IN (SELECT key FROM r WHERE kind <> 3)
    ORDER BY b.key
    FOR UPDATE OF b
),
lcur AS MATERIALIZED (
    SELECT l.key, l.ids, l.exps
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
d AS MATERIALIZED (
    SELECT i.ord, i.key, e.*
    FROM (SELECT r.i AS ord, r.key, p.op, c.key IS NOT NULL AS present, c.tokens, c.ts,
                 r.kind, r.rate, r.period, r.burst, r.maxres, r.start, r.cost, r.reserve, p.now
          FROM p, r LEFT JOIN cur c ON c.key = r.key WHERE r.kind <> 3) i
    CROSS JOIN LATERAL ({{EVAL}}) e
),
-- The requests on concurrency limits: bucket.Leases, then the verdict of
-- bucket.Params.EvalLeases (a release is always allowed; a take or peek
-- if its lease is live or a slot is free).
ld AS MATERIALIZED (
    SELECT r.i AS ord, r.key, r.lease, r.period, c.key IS NOT NULL AS present, c.ids, c.exps, s.*,
           (p.op = 2 OR s.held OR s.live < r.burst / 1000000) AS allowed
    FROM p, r LEFT JOIN lcur c ON c.key = r.key
    CROSS JOIN LATERAL (
        SELECT count(*) AS live, coalesce(bool_or(x.id = r.lease), false) AS held,
               coalesce(min(x.e), 0) AS earliest, coalesce(max(x.e), 0) AS latest
        FROM unnest(c.ids, c.exps) AS x(id, e) WHERE x.e > p.now) s
    WHERE r.kind = 3
),
-- all: every request is allowed (a take writes only then)
ok AS MATERIALIZED (
    SELECT NOT EXISTS (SELECT FROM d WHERE NOT d.allowed) AND NOT EXISTS (SELECT FROM ld WHERE NOT ld.allowed) AS everyone
),
w AS MATERIALIZED (
    SELECT d.key, d.n_tokens, d.n_ts, d.expires
    FROM d, p, ok
    WHERE d.write AND NOT p.late AND (p.op <> 0 OR ok.everyone)
),
-- The lease rows to write: the live leases but the request's own, and for
-- a take the request's lease with a fresh expiry (now + TTL, rounded up
-- to a whole microsecond); expires is the latest expiry. A release of a
-- key without a row writes none.
lw AS MATERIALIZED (
    SELECT ld.key, coalesce(n.ids, '{}') AS ids, coalesce(n.exps, '{}') AS exps, coalesce(n.latest, p.now) AS expires
    FROM p, ok, ld
    CROSS JOIN LATERAL (
        SELECT array_agg(y.id ORDER BY y.o) AS ids, array_agg(y.e ORDER BY y.o) AS exps, max(y.e) AS latest
        FROM (SELECT x.id, x.e, x.o FROM unnest(ld.ids, ld.exps) WITH ORDINALITY AS x(id, e, o)
              WHERE x.e > p.now AND x.id <> ld.lease
              UNION ALL
              SELECT ld.lease,
                     CASE WHEN p.now + ld.period > 0 THEN (p.now + ld.period + 999) / 1000
                          ELSE (p.now + ld.period) / 1000 END * 1000,
                     9223372036854775807
              WHERE p.op = 0) y
    ) n
    WHERE NOT p.late AND ((p.op = 2 AND ld.present) OR (p.op = 0 AND ok.everyone))
),
lup AS (
    INSERT INTO drip.leases AS l (key, ids, exps, expires)
    SELECT key, ids, exps, expires FROM lw ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET ids = excluded.ids, exps = excluded.exps, expires = excluded.expires
    WHERE l.key IN (SELECT key FROM lcur)
    RETURNING 1
),
up AS (
    INSERT INTO drip.buckets AS b (key, tokens, ts, expires)
    SELECT key, n_tokens, n_ts, expires FROM w ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, ts = excluded.ts, expires = excluded.expires
    WHERE b.key IN (SELECT key FROM cur)
    RETURNING 1
)
SELECT x.allowed, x.n_tokens, x.n_ts, p.now, p.late, x.live, x.held, x.earliest, x.latest
FROM (SELECT d.ord, d.allowed, d.n_tokens, d.n_ts, 0::bigint AS live, false AS held, 0::bigint AS earliest, 0::bigint AS latest FROM d
      UNION ALL
      SELECT ld.ord, ld.allowed, 0, 0, ld.live, ld.held, ld.earliest, ld.latest FROM ld) x, p
WHERE drip.ensure((SELECT count(*) FROM up) = (SELECT count(*) FROM w) AND (SELECT count(*) FROM lup) = (SELECT count(*) FROM lw))
ORDER BY x.ord
