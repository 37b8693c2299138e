-- eval.sql: bucket.Eval in SQL, a fragment that the statements include where
-- they say {{EVAL}}, as a LATERAL subquery over a row i with the columns
-- op, present, tokens, ts, counts, kind, rate, period, burst, maxres, start,
-- cost, reserve, now (see functions.sql for units; kind 5 is a calendar
-- window). It yields allowed, write, the bucket after the decision
-- (n_tokens, n_ts: for a denial, the bucket refilled to now), expires,
-- Params.ExpiresAt of that bucket, and n_counts, NULL (a sliding window's
-- counts: see slide.sql). A row whose counts are set is a sliding
-- window's (migration 6): a bucket reads it as no state. The
-- caller derives retry_after and reset_after from the bucket with
-- bucket.Params.Until, in Go (drip.until in SQL).
--
-- Plain SQL on int8 and exact numeric, in three stages (the bucket as
-- found or fresh; refilled; decided): each stage is an OFFSET 0 subquery,
-- so PostgreSQL computes its values once and passes them on instead of
-- copying its expressions into the next stage. (Fewer stages cost less to
-- start: each is a plan node; small expressions are repeated instead.) The helpers it
-- calls (drip.reach, drip.until, drip.expires_at) are one-expression SQL
-- functions that the planner inlines: no function is called at run time.
SELECT o.allowed, o.write, o.n_tokens, o.n_ts,
       drip.expires_at(i.kind, i.rate, i.period, i.burst, o.n_tokens, o.n_ts) AS expires,
       NULL::bigint[] AS n_counts
FROM
-- A calendar window (kind 5, start an instant): a clock behind its start
-- decides at it, and a state from before it is from an earlier window.
(SELECT CASE WHEN i.kind = 5 THEN greatest(i.now, i.start) ELSE i.now END AS now,
        coalesce(i.present, false) AND i.counts IS NULL AND NOT (i.kind = 5 AND i.ts < i.start) AS present
 OFFSET 0) c
-- Params.Fresh for a key without state, or whose state has expired
CROSS JOIN LATERAL (SELECT CASE WHEN NOT c.present
              OR coalesce(c.now >= drip.expires_at(i.kind, i.rate, i.period, i.burst, i.tokens, i.ts), true)
             THEN i.burst ELSE i.tokens END AS t0,
        CASE WHEN NOT (NOT c.present
              OR coalesce(c.now >= drip.expires_at(i.kind, i.rate, i.period, i.burst, i.tokens, i.ts), true)) THEN i.ts
             -- now - ((now - start) mod period), in numeric: in int8, now - start
             -- overflows for a period of centuries (bucket.Params.Fresh)
             WHEN i.kind IN (2, 5) THEN c.now - mod(mod(c.now::numeric - i.start, i.period) + i.period, i.period)::bigint
             ELSE c.now END AS s0
 OFFSET 0) b
-- Params.Refilled
CROSS JOIN LATERAL (SELECT
    CASE WHEN c.now <= b.s0 THEN least(b.t0, i.burst)
         WHEN i.burst - b.t0 <= 0 THEN i.burst
         WHEN i.kind = 0 THEN CASE
             WHEN div((c.now - b.s0)::numeric * i.rate, i.period) >= i.burst - b.t0 THEN i.burst
             ELSE b.t0 + div((c.now - b.s0)::numeric * i.rate, i.period)::bigint END
         WHEN (c.now - b.s0) / i.period >= (i.burst - b.t0) / i.rate + ((i.burst - b.t0) % i.rate <> 0)::int THEN i.burst
         ELSE b.t0 + (c.now - b.s0) / i.period * i.rate
         END AS tokens,
    CASE WHEN c.now <= b.s0 THEN b.s0
         WHEN i.kind <> 0 THEN b.s0 + (c.now - b.s0) / i.period * i.period
         WHEN i.burst - b.t0 <= 0 THEN c.now
         WHEN div((c.now - b.s0)::numeric * i.rate, i.period) >= i.burst - b.t0 THEN c.now
         ELSE c.now - div(mod((c.now - b.s0)::numeric * i.rate, i.period), i.rate)::bigint
         END AS ts
    OFFSET 0) a
-- the decision (allowed, repeated where it is needed)
CROSS JOIN LATERAL (SELECT
    (i.op = 2 OR a.tokens >= i.cost OR (i.reserve AND (i.maxres < 0 OR i.cost - a.tokens <= i.maxres))) AS allowed,
    i.op = 2 OR (i.op = 0 AND (a.tokens >= i.cost OR (i.reserve AND (i.maxres < 0 OR i.cost - a.tokens <= i.maxres)))) AS write,
    CASE WHEN i.op = 2 THEN least(i.burst, a.tokens + i.cost)
         WHEN a.tokens >= i.cost OR (i.reserve AND (i.maxres < 0 OR i.cost - a.tokens <= i.maxres)) THEN a.tokens - i.cost
         ELSE a.tokens END AS n_tokens,
    a.ts AS n_ts
    OFFSET 0) o
