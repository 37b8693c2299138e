-- drip's SQL functions: the math of math.go in PL/pgSQL (bit for bit: int8
-- and exact numeric arithmetic, never floats), and the functions any
-- language can call. Installed (CREATE OR REPLACE) by every drip pg install.
--
-- Units: amounts are bigint micro-tokens (1e6 per token), times bigint
-- nanoseconds since the Unix epoch. kind: 0 continuous token bucket,
-- 1 interval refill, 2 fixed window. op: 0 take, 1 peek, 2 refund.

-- drip.clock is the server's clock in nanoseconds (microsecond resolution).
CREATE OR REPLACE FUNCTION drip.clock() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint $$;

-- drip.reach is Params.reach: the instant (ns) at which a bucket of
-- (tokens, ts) holds target micro-tokens (ts if it already does),
-- saturating; on the grid for kinds 1 and 2.
CREATE OR REPLACE FUNCTION drip.reach(kind int, rate bigint, period bigint,
    tokens bigint, ts bigint, target bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    maxi CONSTANT bigint := 9223372036854775807;
    need bigint := target - tokens;
    d numeric;
    k bigint;
BEGIN
    IF need <= 0 THEN
        RETURN ts;
    END IF;
    IF kind = 0 THEN
        -- mulDivCeil, saturating; div and mod are exact on numeric.
        d := div(need::numeric * period, rate);
        IF mod(need::numeric * period, rate) <> 0 THEN
            d := d + 1;
        END IF;
        d := least(d, maxi);
    ELSE
        k := need / rate + (need % rate <> 0)::int;
        IF k > maxi / period THEN
            RETURN maxi;
        END IF;
        d := k * period;
    END IF;
    IF d > maxi - ts THEN
        RETURN maxi;
    END IF;
    RETURN ts + d::bigint;
END $$;

-- drip.until is Params.Until: nanoseconds after now until a bucket of
-- (tokens, ts) holds target micro-tokens.
CREATE OR REPLACE FUNCTION drip.until(kind int, rate bigint, period bigint,
    tokens bigint, ts bigint, target bigint, now bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN tokens >= target THEN 0
        ELSE greatest(0, drip.reach(kind, rate, period, tokens, ts, target) - now) END
$$;

-- drip.expires_at is Params.ExpiresAt: the instant from which a stored
-- bucket carries no information (full again; for interval refills one
-- period later).
CREATE OR REPLACE FUNCTION drip.expires_at(kind int, rate bigint, period bigint,
    burst bigint, tokens bigint, ts bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN kind <> 1 THEN t
        WHEN t > 9223372036854775807 - period THEN 9223372036854775807
        ELSE t + period END
    FROM drip.reach(kind, rate, period, tokens, ts, burst) t
$$;

-- drip.eval is drip.Eval: the decision of op on a bucket (present: whether
-- the key has a row) at now, the bucket to store and whether to write it,
-- retry and reset in ns, and expires (Params.ExpiresAt of the new bucket,
-- kept in the row for the sweeper).
CREATE OR REPLACE FUNCTION drip.eval(op int, present bool, tokens bigint, ts bigint,
    kind int, rate bigint, period bigint, burst bigint, maxres bigint, start bigint,
    cost bigint, reserve bool, now bigint,
    OUT allowed bool, OUT write bool, OUT n_tokens bigint, OUT n_ts bigint,
    OUT retry bigint, OUT reset bigint, OUT expires bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    maxi CONSTANT bigint := 9223372036854775807;
    e bigint;
    missing bigint;
    prod numeric;
    q numeric;
    n bigint;
    r bigint;
BEGIN
    IF NOT coalesce(present, false)
        OR now >= drip.expires_at(kind, rate, period, burst, tokens, ts) THEN
        -- Params.Fresh
        tokens := burst;
        ts := now;
        IF kind = 2 THEN
            r := (now - start) % period;
            IF r < 0 THEN
                r := r + period;
            END IF;
            ts := now - r;
        END IF;
    END IF;
    -- Params.Refilled
    IF now <= ts THEN
        tokens := least(tokens, burst);
    ELSE
        e := now - ts;
        missing := burst - tokens;
        IF kind = 0 THEN
            IF missing <= 0 THEN
                tokens := burst;
                ts := now;
            ELSE
                prod := e::numeric * rate;
                q := div(prod, period);
                IF q >= missing THEN
                    tokens := burst;
                    ts := now;
                ELSE
                    tokens := tokens + q::bigint;
                    ts := now - div(prod - q * period, rate)::bigint;
                END IF;
            END IF;
        ELSE
            n := e / period;
            ts := ts + n * period;
            -- ceilDiv(missing, rate), for missing > 0
            r := missing / rate + (missing % rate <> 0)::int;
            IF missing <= 0 OR n >= r THEN
                tokens := burst;
            ELSE
                tokens := tokens + n * rate;
            END IF;
        END IF;
    END IF;
    n_ts := ts;
    retry := 0;
    IF op = 2 THEN
        allowed := true;
        write := true;
        n_tokens := least(burst, tokens + cost);
    ELSE
        IF tokens >= cost THEN
            allowed := true;
            n_tokens := tokens - cost;
        ELSIF reserve AND (maxres < 0 OR cost - tokens <= maxres) THEN
            allowed := true;
            n_tokens := tokens - cost;
            retry := drip.until(kind, rate, period, n_tokens, ts, 0, now);
        ELSE
            allowed := false;
            n_tokens := tokens;
            retry := drip.until(kind, rate, period, tokens, ts, cost, now);
        END IF;
        write := allowed AND op = 0;
    END IF;
    reset := drip.until(kind, rate, period, n_tokens, n_ts, burst, now);
    expires := drip.expires_at(kind, rate, period, burst, n_tokens, n_ts);
END $$;

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
    p_cost := drip.micro(cost);
    p_maxres := CASE WHEN coalesce(max_reserved, 0) > 0 THEN drip.micro(max_reserved) ELSE -1 END;
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
END $$;
