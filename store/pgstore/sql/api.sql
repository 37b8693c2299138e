-- api.sql: the functions other languages call, on the same buckets as the
-- Go store:
--
--   SELECT * FROM drip.take('user:1', 10, '1 second', 20, 1);
--
-- Arguments: key, rate, period (default 1 second), burst (default rate),
-- cost (default 1), reserve, refill ('continuous' or 'interval'), algorithm
-- ('token_bucket' or 'fixed_window'), max_reserved (0: no bound), start
-- (fixed windows: grid offset; NULL: derived from the key as drip does), at
-- (the time of the decision; NULL: the server's clock). Results: allowed,
-- tokens, remaining, limit, retry_after and reset_after (seconds).
--
-- drip.apply_one and drip.peek_one are take.sql and peek.sql as SQL
-- functions; the installer creates them from those files, so the Go store
-- and these functions run the same statements. On distributed SQL (or at
-- SERIALIZABLE) a call may fail with SQLSTATE 40001 under contention:
-- retry it, as the Go store does.

CREATE OR REPLACE FUNCTION drip.decide(op int, key text, rate float8, period interval,
    burst float8, cost float8, reserve bool, refill text, algorithm text,
    max_reserved float8, start interval, at timestamptz)
RETURNS TABLE (allowed bool, tokens float8, remaining bigint, "limit" float8,
    retry_after float8, reset_after float8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    pr record;
    d record;
    now_ns bigint := (extract(epoch FROM at) * 1000000000)::bigint;
    v_cap bigint;
BEGIN
    IF op IS NULL OR op NOT IN (0, 1, 2) THEN
        RAISE EXCEPTION 'drip: invalid op: % is not take (0), peek (1) or refund (2)', op USING ERRCODE = 'invalid_parameter_value';
    END IF;
    pr := drip.prepare(key, rate, period, burst, cost, reserve, refill, algorithm, max_reserved, start);
    FOR attempt IN 1 .. 10 LOOP
        v_cap := pr.p_burst;
        IF EXISTS (SELECT FROM drip.buckets b WHERE b.key = pr.k AND b.ids IS NOT NULL) THEN
            -- The key holds blocks of leased tokens (a Go instance leases
            -- it): decided under their cap, by drip.block_apply, as the Go
            -- store decides it. (apply_one and peek_one answer such a key
            -- with ok false, writing nothing.)
            SELECT x.allowed, x.n_tokens, x.n_ts, x.now, NOT x.late AS ok,
                   pr.p_burst - coalesce((SELECT sum(z.size) FROM unnest(x.sizes, x.exps) AS z(size, exp)
                                          WHERE z.exp > x.now), 0) AS cap
            INTO d
            FROM drip.block_apply(op, ARRAY[pr.k], ARRAY[pr.kind], ARRAY[pr.p_rate], ARRAY[pr.p_period],
                ARRAY[pr.p_burst], ARRAY[pr.p_maxres], ARRAY[pr.p_start], ARRAY[pr.p_cost],
                ARRAY[coalesce(reserve, false)], ARRAY[''], ARRAY[''], ARRAY[0::bigint], now_ns, NULL) x;
            v_cap := greatest(0, d.cap);
        ELSIF op = 1 THEN
            SELECT * INTO d FROM drip.peek_one(pr.k, op, pr.kind, pr.p_rate, pr.p_period, pr.p_burst,
                pr.p_maxres, pr.p_start, pr.p_cost, coalesce(reserve, false), now_ns);
        ELSE
            SELECT * INTO d FROM drip.apply_one(pr.k, op, pr.kind, pr.p_rate, pr.p_period, pr.p_burst,
                pr.p_maxres, pr.p_start, pr.p_cost, coalesce(reserve, false), now_ns);
        END IF;
        IF FOUND AND d.ok THEN
            allowed := d.allowed;
            tokens := d.n_tokens::float8 / 1000000;
            remaining := greatest(0, d.n_tokens) / 1000000;
            "limit" := pr.p_burst::float8 / 1000000;
            -- bucket.Eval's retry and reset, from the bucket after the decision
            IF op = 2 OR (d.allowed AND d.n_tokens >= 0) THEN
                retry_after := 0;
            ELSIF d.allowed THEN
                retry_after := drip.until(pr.kind, pr.p_rate, pr.p_period, d.n_tokens, d.n_ts, 0, d.now)::float8 / 1e9;
            ELSE
                -- Params.NeedFor: a bounded reservation passes once the debt fits
                retry_after := drip.until(pr.kind, pr.p_rate, pr.p_period, d.n_tokens, d.n_ts,
                    CASE WHEN coalesce(reserve, false) AND pr.p_maxres >= 0 THEN pr.p_cost - pr.p_maxres ELSE pr.p_cost END,
                    d.now)::float8 / 1e9;
            END IF;
            reset_after := drip.until(pr.kind, pr.p_rate, pr.p_period, d.n_tokens, d.n_ts, v_cap, d.now)::float8 / 1e9;
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'drip: no decision after 10 attempts' USING ERRCODE = 'serialization_failure';
END $$;

CREATE OR REPLACE FUNCTION drip.take(key text, rate float8, period interval DEFAULT '1 second',
    burst float8 DEFAULT NULL, cost float8 DEFAULT 1, reserve bool DEFAULT false,
    refill text DEFAULT 'continuous', algorithm text DEFAULT 'token_bucket',
    max_reserved float8 DEFAULT 0, start interval DEFAULT NULL, at timestamptz DEFAULT NULL)
RETURNS TABLE (allowed bool, tokens float8, remaining bigint, "limit" float8,
    retry_after float8, reset_after float8)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM drip.decide(0, key, rate, period, burst, cost, reserve, refill, algorithm, max_reserved, start, at)
$$;

CREATE OR REPLACE FUNCTION drip.peek(key text, rate float8, period interval DEFAULT '1 second',
    burst float8 DEFAULT NULL, cost float8 DEFAULT 1, reserve bool DEFAULT false,
    refill text DEFAULT 'continuous', algorithm text DEFAULT 'token_bucket',
    max_reserved float8 DEFAULT 0, start interval DEFAULT NULL, at timestamptz DEFAULT NULL)
RETURNS TABLE (allowed bool, tokens float8, remaining bigint, "limit" float8,
    retry_after float8, reset_after float8)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM drip.decide(1, key, rate, period, burst, cost, reserve, refill, algorithm, max_reserved, start, at)
$$;

CREATE OR REPLACE FUNCTION drip.refund(key text, rate float8, period interval DEFAULT '1 second',
    burst float8 DEFAULT NULL, cost float8 DEFAULT 1,
    refill text DEFAULT 'continuous', algorithm text DEFAULT 'token_bucket',
    start interval DEFAULT NULL, at timestamptz DEFAULT NULL)
RETURNS TABLE (allowed bool, tokens float8, remaining bigint, "limit" float8,
    retry_after float8, reset_after float8)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM drip.decide(2, key, rate, period, burst, cost, true, refill, algorithm, 0, start, at)
$$;

-- drip.reset deletes the bucket of key (it is full again); true if it had
-- state.
CREATE OR REPLACE FUNCTION drip.reset(key text) RETURNS bool
LANGUAGE sql VOLATILE AS $$
    WITH d AS (DELETE FROM drip.buckets WHERE buckets.key = drip.key(reset.key) RETURNING 1)
    SELECT count(*) > 0 FROM d
$$;
