-- slide.sql: bucket.EvalSliding in SQL, the fragment that statements
-- carrying a sliding window (kind 4) run for it in place of eval.sql (see
-- sliding.sql). Over the same row i as eval.sql, where for a sliding
-- window burst is the limit (micro-tokens), period the window (ns), start
-- the number of slots, maxres the offset of the slot grid from the
-- epoch's (0 to slot-1, SlidingParams.Start), and ts and counts the stored
-- state (migration 6).
-- It yields eval.sql's columns: allowed, write, n_tokens (what may still
-- be taken after the decision: the limit less the counts), n_ts (the
-- newest slot's index), expires (SlidingParams.SlidingExpiresAt) and
-- n_counts (the counts after the decision: for a peek or a denial, those
-- the decision counted, written by nobody).
--
-- The same integers as bucket/sliding.go, in stages as eval.sql's:
-- g the slot's length (ceil(window/slots)), the number of counts n and
-- whether the stored state is one (found: a row with n counts); t the
-- current slot (floor((now-maxres)/slot)), never before the stored one (a
-- clock that went back moves nothing); s the counts shifted to it (those of
-- slots before t.j - slots dropped); u their sum; o the decision: a take or
-- peek adds its cost to the newest slot if the sum stays within the limit,
-- a refund gives back from the newest slot first, never below zero. Go
-- recomputes the decision with bucket.EvalSliding from the state before
-- (the statements return it) and checks this one against it.
SELECT o.allowed, o.write, i.burst - o.used AS n_tokens, t.j AS n_ts,
       least((t.j + g.n)::numeric * g.slot + i.maxres, 9223372036854775807)::bigint AS expires, o.n_counts
FROM
(SELECT i.period / i.start + (i.period % i.start <> 0)::int AS slot, i.start + 1 AS n,
        coalesce(i.present, false) AND coalesce(cardinality(i.counts) = i.start + 1, false) AS found
 OFFSET 0) g
CROSS JOIN LATERAL (SELECT CASE WHEN g.found AND f.j < i.ts THEN i.ts ELSE f.j END AS j
    -- floor((now - maxres) / slot), in numeric: in int8, now - maxres
    -- overflows before 1970 for a grid moved by most of a long slot
    FROM (SELECT (div(d.x, g.slot) - (mod(d.x, g.slot) < 0)::int)::bigint AS j
          FROM (SELECT i.now::numeric - i.maxres AS x) d) f
    OFFSET 0) t
CROSS JOIN LATERAL (SELECT ARRAY(
        SELECT CASE WHEN g.found AND t.j - i.ts <= g.n - k THEN i.counts[k + (t.j - i.ts)::int] ELSE 0 END
        FROM generate_series(1, g.n::int) k ORDER BY k) AS arr
    OFFSET 0) s
CROSS JOIN LATERAL (SELECT (SELECT coalesce(sum(x), 0) FROM unnest(s.arr) x)::bigint AS used OFFSET 0) u
CROSS JOIN LATERAL (SELECT
    i.op = 2 OR u.used + i.cost <= i.burst AS allowed,
    i.op = 2 OR (i.op = 0 AND u.used + i.cost <= i.burst) AS write,
    CASE WHEN i.op = 2 THEN greatest(u.used - i.cost, 0)
         WHEN u.used + i.cost <= i.burst THEN u.used + i.cost
         ELSE u.used END AS used,
    CASE WHEN i.op = 2 THEN ARRAY(
             -- each slot gives what the cost still asks after the newer ones gave theirs
             SELECT (v.x - least(v.x, greatest(0, i.cost - coalesce(sum(v.x) OVER (ORDER BY v.k DESC
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0))))::bigint
             FROM unnest(s.arr) WITH ORDINALITY v(x, k) ORDER BY v.k)
         WHEN u.used + i.cost <= i.burst THEN s.arr[1:(g.n - 1)::int] || (s.arr[g.n::int] + i.cost)
         ELSE s.arr END AS n_counts
    OFFSET 0) o
