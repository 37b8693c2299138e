-- drip's SQL functions: the helpers of the math of bucket/bucket.go (bit for bit:
-- int8 and exact numeric arithmetic, never floats; the rest of the math is
-- eval.sql), and the functions any language can call. Installed (CREATE OR
-- REPLACE) by every drip pg install.
--
-- Units: amounts are bigint micro-tokens (1e6 per token), times bigint
-- nanoseconds since the Unix epoch. kind: 0 continuous token bucket,
-- 1 interval refill, 2 fixed window. op: 0 take, 1 peek, 2 refund.

-- drip.clock is the server's clock in nanoseconds (microsecond resolution).
CREATE OR REPLACE FUNCTION drip.clock() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint $$;

-- The math that statements run is plain SQL: drip.reach, drip.until and
-- drip.expires_at below are one-expression SQL functions that the planner
-- inlines, and eval.sql is a fragment of the statements themselves. Only
-- exact arithmetic: int8, and numeric where bucket.go needs 128 bits.

-- drip.reach_n is drip.reach without saturation, as numeric: ts plus
-- ceil(need * period / rate) ns (continuous) or ceil(need / rate) whole
-- periods (interval, fixed window). need must be > 0.
CREATE OR REPLACE FUNCTION drip.reach_n(kind int, rate bigint, period bigint,
    tokens bigint, ts bigint, target bigint) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ts::numeric + CASE WHEN kind = 0
        THEN div((target - tokens)::numeric * period + (rate - 1), rate)
        ELSE div((target - tokens)::numeric + (rate - 1), rate) * period END
$$;

-- drip.reach is Params.reach: the instant (ns) at which a bucket of
-- (tokens, ts) holds target micro-tokens (ts if it already does),
-- saturating at the largest bigint; on the grid for kinds 1 and 2. (For
-- ts >= 0, which drip's times are, min(ts + d, max) is bucket.go's
-- saturating sum.)
CREATE OR REPLACE FUNCTION drip.reach(kind int, rate bigint, period bigint,
    tokens bigint, ts bigint, target bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN tokens >= target THEN ts
        ELSE least(drip.reach_n(kind, rate, period, tokens, ts, target), 9223372036854775807)::bigint END
$$;

-- drip.until is Params.Until: nanoseconds after now until a bucket of
-- (tokens, ts) holds target micro-tokens.
CREATE OR REPLACE FUNCTION drip.until(kind int, rate bigint, period bigint,
    tokens bigint, ts bigint, target bigint, now bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN tokens >= target THEN 0::bigint
        ELSE greatest(0, least(drip.reach_n(kind, rate, period, tokens, ts, target), 9223372036854775807)::bigint - now) END
$$;

-- drip.expires_at is Params.ExpiresAt: the instant from which a stored
-- bucket carries no information (full again; for interval refills one
-- period later).
CREATE OR REPLACE FUNCTION drip.expires_at(kind int, rate bigint, period bigint,
    burst bigint, tokens bigint, ts bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(CASE WHEN tokens >= burst THEN ts::numeric
                      ELSE drip.reach_n(kind, rate, period, tokens, ts, burst) END
                 + CASE WHEN kind = 1 THEN period ELSE 0 END,
                 9223372036854775807)::bigint
$$;

-- drip.ensure raises a serialization failure (SQLSTATE 40001) unless ok:
-- the batch statements call it when a bucket appeared between their
-- locking read and their write, so that the whole statement rolls back and
-- is retried like any serialization failure.
CREATE OR REPLACE FUNCTION drip.ensure(ok bool) RETURNS bool
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION 'drip: a bucket changed under a batch; retry'
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN true;
END $$;

-- drip.key maps a text key to its stored form (see the bucket table).
CREATE OR REPLACE FUNCTION drip.key(key text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(convert_to(key, 'UTF8')) > 512
        THEN '\xff'::bytea || sha256(convert_to(key, 'UTF8'))
        ELSE convert_to(key, 'UTF8') END
$$;

-- drip.micro is the fixed point of an amount, as drip.Limit rounds it.
CREATE OR REPLACE FUNCTION drip.micro(x float8) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN abs(x * 1000000) >= 4503599627370496 THEN (x * 1000000)::bigint
        ELSE (sign(x) * floor(abs(x * 1000000) + 0.5))::bigint END
$$;

-- drip.micro_cost is drip.CostMicro: a cost (or refund) in micro-tokens,
-- rounded up, so that no cost rounds to 0 and is free.
CREATE OR REPLACE FUNCTION drip.micro_cost(x float8) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT n + CASE WHEN n::float8 / 1000000 < x THEN 1 ELSE 0 END FROM (SELECT drip.micro(x) AS n) s
$$;

-- drip.window_start is drip.WindowStart: FNV-1a (64 bit) of the key
-- modulo the period, the default offset of a fixed window's grid.
CREATE OR REPLACE FUNCTION drip.window_start(key text, period bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    b bytea := convert_to(key, 'UTF8');
    h numeric := 14695981039346656037;
    lo int;
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        lo := mod(h, 256)::int;
        h := h - lo + (lo # get_byte(b, i));
        h := mod(h * 1099511628211, 18446744073709551616);
    END LOOP;
    RETURN mod(h, period)::bigint;
END $$;

-- drip.prepare is drip.Prepare for SQL callers: it validates a limit and a
-- cost and returns them in fixed point, raising an error for bad input.
CREATE OR REPLACE FUNCTION drip.prepare(key text, rate float8, period interval, burst float8,
    cost float8, reserve bool, refill text, algorithm text, max_reserved float8, start interval,
    OUT k bytea, OUT kind int, OUT p_rate bigint, OUT p_period bigint, OUT p_burst bigint,
    OUT p_maxres bigint, OUT p_start bigint, OUT p_cost bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF key IS NULL OR key = '' THEN
        RAISE EXCEPTION 'drip: missing key' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    burst := coalesce(burst, rate);
    IF rate IS NULL OR NOT rate > 0 OR rate > 1e12 OR drip.micro(rate) = 0 THEN
        RAISE EXCEPTION 'drip: invalid limit: rate must be > 0, at least 0.000001 and at most 1e12' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT burst > 0 OR burst > 1e12 OR drip.micro(burst) = 0 THEN
        RAISE EXCEPTION 'drip: invalid limit: burst must be > 0, at least 0.000001 and at most 1e12' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    p_period := (extract(epoch FROM coalesce(period, interval '1 second')) * 1000000000)::bigint;
    IF p_period <= 0 THEN
        RAISE EXCEPTION 'drip: invalid limit: period must be > 0' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF coalesce(max_reserved, 0) < 0 OR max_reserved > 1e12 THEN
        RAISE EXCEPTION 'drip: invalid limit: max_reserved must be >= 0 and at most 1e12' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cost IS NULL OR NOT cost >= 0 OR cost > 1e12 OR cost = 'Infinity'::float8 THEN
        RAISE EXCEPTION 'drip: invalid cost: % (must be a finite number >= 0)', cost USING ERRCODE = 'invalid_parameter_value';
    END IF;
    k := drip.key(key);
    p_rate := drip.micro(rate);
    p_burst := drip.micro(burst);
    p_cost := drip.micro_cost(cost);
    -- No bound is 1e12 tokens, as in drip.ParamsOf: debt stays inside a bigint.
    p_maxres := CASE WHEN coalesce(max_reserved, 0) > 0 THEN drip.micro(max_reserved) ELSE 1000000000000000000 END;
    p_start := 0;
    CASE coalesce(algorithm, 'token_bucket')
    WHEN 'token_bucket' THEN
        CASE coalesce(refill, 'continuous')
        WHEN 'continuous' THEN kind := 0;
        WHEN 'interval' THEN kind := 1;
        ELSE RAISE EXCEPTION 'drip: invalid limit: refill % is not continuous or interval', refill USING ERRCODE = 'invalid_parameter_value';
        END CASE;
    WHEN 'fixed_window' THEN
        kind := 2;
        IF start IS NULL THEN
            p_start := drip.window_start(key, p_period);
        ELSE
            p_start := (extract(epoch FROM start) * 1000000000)::bigint % p_period;
        END IF;
    ELSE
        RAISE EXCEPTION 'drip: invalid limit: algorithm % is not token_bucket or fixed_window', algorithm USING ERRCODE = 'invalid_parameter_value';
    END CASE;
    IF p_cost > p_burst AND NOT coalesce(reserve, false) THEN
        RAISE EXCEPTION 'drip: cost exceeds burst: cost % > burst % can never succeed without reserve', cost, burst USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A reservation beyond the burst plus the bound on debt could never fit
    -- (drip.CostOf). drip.refund passes reserve with no bound: any cost.
    IF p_cost - p_burst > p_maxres THEN
        RAISE EXCEPTION 'drip: cost exceeds burst: cost % > burst % + max_reserved % can never be reserved', cost, burst, max_reserved USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
