-- blocks.sql: leased tokens (package leased, bucket.EvalBlocks) in one
-- statement: SELECT * FROM drip.block_apply(...), one round trip per call.
-- Installed (CREATE OR REPLACE) by every install, like functions.sql; the
-- installer puts eval.sql in place of the EVAL marker.
--
-- A key's blocks live in its own row of drip.buckets (migration 8: ids,
-- sizes, exps; NULL for none), beside its bucket, so every request on the
-- key, leased or not, is held to their cap. A call that holds a block's
-- take or return, or a request of the SQL functions on a key whose row
-- holds blocks (drip.decide, api.sql; the Go store's plain statements
-- decide those themselves), is decided here whole: its buckets by
-- bucket.EvalBlocks on their rows, its concurrency limits on their lease
-- rows (sql/leases.sql), all or nothing.

-- drip.eval_one is bucket.Eval on one bucket: eval.sql as a function of
-- its inputs (see there for units and kinds). plpgsql, not SQL: a SQL
-- function called from plpgsql is planned again on every call, where
-- plpgsql keeps its query's plan for the session.
CREATE OR REPLACE FUNCTION drip.eval_one(p_op int, p_present bool, p_tokens bigint, p_ts bigint,
    p_kind int, p_rate bigint, p_period bigint, p_burst bigint, p_maxres bigint, p_start bigint,
    p_cost bigint, p_reserve bool, p_now bigint,
    OUT allowed bool, OUT write bool, OUT n_tokens bigint, OUT n_ts bigint, OUT expires bigint)
LANGUAGE plpgsql IMMUTABLE AS $drip$
BEGIN
    SELECT e.allowed, e.write, e.n_tokens, e.n_ts, e.expires INTO allowed, write, n_tokens, n_ts, expires
    FROM (SELECT p_op AS op, p_present AS present, p_tokens AS tokens, p_ts AS ts, NULL::bigint[] AS counts, p_kind AS kind,
                 p_rate AS rate, p_period AS period, p_burst AS burst, p_maxres AS maxres,
                 p_start AS start, p_cost AS cost, p_reserve AS reserve, p_now AS now) i
    CROSS JOIN LATERAL ({{EVAL}}) e;
END $drip$;

-- drip.block_advance is bucket.Params.Advance: the bucket (present,
-- tokens, ts) of a key whose blocks are (ids, sizes, exps), brought to now
-- through the expiries of its blocks, each in order of expiry (then ID) a
-- refund of nothing under the cap of the blocks live until then (burst
-- less their sizes, not below 0), at the expiry, or for kinds other than
-- continuous one nanosecond before it (before a grid point's refill). It
-- returns the bucket, the blocks live at now (in their order) and the cap
-- of those.
CREATE OR REPLACE FUNCTION drip.block_advance(kind int, rate bigint, period bigint, burst bigint,
    maxres bigint, start bigint, INOUT present bool, INOUT tokens bigint, INOUT ts bigint,
    INOUT ids text[], INOUT sizes bigint[], INOUT exps bigint[], now bigint, OUT cap bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    o bigint := 0;
    n int := coalesce(cardinality(ids), 0);
    expired int := 0;
    e record;
    b record;
BEGIN
    FOR j IN 1 .. n LOOP
        o := o + sizes[j];
        IF exps[j] <= now THEN
            expired := expired + 1;
        END IF;
    END LOOP;
    cap := greatest(0, burst - o);
    IF expired = 0 THEN
        RETURN;
    END IF;
    FOR b IN SELECT u.size, u.exp FROM unnest(ids, sizes, exps) AS u(id, size, exp)
             WHERE u.exp <= now ORDER BY u.exp, u.id LOOP
        e := drip.eval_one(2, present, tokens, ts, kind, rate, period, cap, maxres, start, 0, false,
                           CASE WHEN kind <> 0 THEN b.exp - 1 ELSE b.exp END);
        tokens := e.n_tokens;
        ts := e.n_ts;
        present := true;
        o := o - b.size;
        cap := greatest(0, burst - o);
    END LOOP;
    SELECT coalesce(array_agg(u.id ORDER BY u.j), '{}'), coalesce(array_agg(u.size ORDER BY u.j), '{}'),
           coalesce(array_agg(u.exp ORDER BY u.j), '{}')
    INTO ids, sizes, exps
    FROM unnest(ids, sizes, exps) WITH ORDINALITY AS u(id, size, exp, j) WHERE u.exp > now;
END $$;

-- drip.block_expires is when a key's bucket and blocks carry no more
-- information, for the sweeper: no earlier than
-- bucket.Params.StateExpiresAt, without walking the blocks. Until the
-- last block expires the bucket only refills (under caps of at least 0)
-- or is clamped to such a cap, so then it holds at least the lesser of
-- its tokens and 0, with a ts no later than that expiry: from there it is
-- full again no later than drip.expires_at says.
CREATE OR REPLACE FUNCTION drip.block_expires(kind int, rate bigint, period bigint, burst bigint,
    tokens bigint, ts bigint, exps bigint[])
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    last bigint;
BEGIN
    IF coalesce(cardinality(exps), 0) = 0 THEN
        RETURN drip.expires_at(kind, rate, period, burst, tokens, ts);
    END IF;
    SELECT max(x) INTO last FROM unnest(exps) AS x;
    RETURN greatest(last, drip.expires_at(kind, rate, period, burst, least(tokens, 0), last));
END $$;

-- drip.block_step is bucket.EvalBlocks on one bucket: a request (op 0
-- take, 1 peek, 2 refund; a block's take or return when p_block is not
-- '') on the bucket (present, tokens, ts) of a key whose blocks are
-- (ids, sizes, exps), at p_now. It returns the verdict, whether the
-- request writes, and the bucket and blocks it leaves. drip.block_apply
-- and drip.block_batch decide each bucket with it.
CREATE OR REPLACE FUNCTION drip.block_step(p_op int, p_present bool, p_tokens bigint, p_ts bigint,
    p_ids text[], p_sizes bigint[], p_exps bigint[], p_kind int, p_rate bigint, p_period bigint,
    p_burst bigint, p_maxres bigint, p_start bigint, p_cost bigint, p_reserve bool, p_block text,
    p_ttl bigint, p_now bigint,
    OUT allowed bool, OUT write bool, OUT n_tokens bigint, OUT n_ts bigint,
    OUT n_ids text[], OUT n_sizes bigint[], OUT n_exps bigint[])
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    a record;
    e record;
    x int;
    v_cap bigint;
    v_exp bigint;
BEGIN
    a := drip.block_advance(p_kind, p_rate, p_period, p_burst, p_maxres, p_start, p_present, p_tokens, p_ts,
                            p_ids, p_sizes, p_exps, p_now);
    v_cap := a.cap;
    n_ids := a.ids; n_sizes := a.sizes; n_exps := a.exps;
    x := array_position(a.ids, p_block);
    IF p_block = '' OR p_op = 1 THEN
        e := drip.eval_one(p_op, a.present, a.tokens, a.ts, p_kind, p_rate, p_period,
                           v_cap, p_maxres, p_start, p_cost, p_reserve, p_now);
        allowed := e.allowed;
        write := e.write;
    ELSIF p_op = 0 AND x IS NOT NULL THEN
        -- a take under a live ID: nothing more taken
        e := drip.eval_one(1, a.present, a.tokens, a.ts, p_kind, p_rate, p_period,
                           v_cap, p_maxres, p_start, 0, false, p_now);
        allowed := e.allowed;
        write := false;
    ELSIF p_op = 0 AND cardinality(a.ids) >= 64 THEN
        -- bucket.MaxBlocks live: denied
        e := drip.eval_one(1, a.present, a.tokens, a.ts, p_kind, p_rate, p_period,
                           v_cap, p_maxres, p_start, p_cost, false, p_now);
        allowed := false;
        write := false;
    ELSIF p_op = 0 THEN
        e := drip.eval_one(0, a.present, a.tokens, a.ts, p_kind, p_rate, p_period,
                           v_cap, p_maxres, p_start, p_cost, false, p_now);
        allowed := e.allowed;
        write := e.write;
        IF e.write THEN
            -- bucket.Params.BlockExp
            v_exp := p_now + p_ttl;
            IF p_kind = 2 THEN
                v_exp := least(v_exp, e.n_ts + p_period);
            END IF;
            n_ids := a.ids || p_block;
            n_sizes := a.sizes || p_cost;
            n_exps := a.exps || v_exp;
        END IF;
    ELSE
        -- a return: the block leaves the outstanding tokens, its unused
        -- ones go back, capped
        e := drip.eval_one(2, a.present, a.tokens, a.ts, p_kind, p_rate, p_period,
                           v_cap, p_maxres, p_start, 0, false, p_now);
        allowed := e.allowed;
        write := x IS NOT NULL;
        IF x IS NOT NULL THEN
            v_cap := v_cap + a.sizes[x];
            e.n_tokens := least(v_cap, e.n_tokens + least(p_cost, a.sizes[x]));
            n_ids := a.ids[:x - 1] || a.ids[x + 1:];
            n_sizes := a.sizes[:x - 1] || a.sizes[x + 1:];
            n_exps := a.exps[:x - 1] || a.exps[x + 1:];
        END IF;
    END IF;
    n_tokens := e.n_tokens; n_ts := e.n_ts;
END $$;

-- drip.block_apply decides one call (a take, peek or refund of several
-- items, distinct keys) as bucket.EvalMultiAll does, all or nothing. One
-- array per field, one element per item: keys (stored form), kinds, rates,
-- periods, bursts, max reserved, starts, costs, reserves, lease IDs (a
-- concurrency limit's), and block IDs and block TTLs (ns) of block takes
-- and returns ('' and 0 for a plain request); p_at the time in ns (NULL:
-- the server's clock, read after the locks), p_dl the caller's deadline
-- in the server's clock (NULL: none). No item is a sliding window.
--
-- It locks the rows of the call's keys in one order, the same in every
-- statement (drip.buckets, then drip.leases, each in key order, as
-- multi.sql does), so statements never deadlock each other, then reads
-- each key's state, latest version, and decides every item: a
-- concurrency limit's (kind 3) by bucket.Params.EvalLeases on its lease
-- rows, any other by bucket.EvalBlocks on its row in drip.buckets (its
-- bucket and blocks; a row holding a sliding window's counts is no
-- state, and the write replaces it). Writes follow EvalMultiAll: a peek
-- writes nothing, a refund what it decided, a take everything only if
-- every item was allowed. A statement that got its locks after its
-- deadline is late: it decides and writes nothing. A key whose row
-- appeared after it was read (a concurrent first write) raises 40001
-- (drip.ensure): the statement rolls back and the store runs it again.
--
-- A row per item, in order: the verdict, the state as read (whether the
-- key had a row, its bucket and blocks; for a concurrency limit what
-- bucket.Leases summarizes), the bucket and the number of blocks after
-- the decision, the time and whether it was late. The Go store decides
-- again from the state as read, with bucket.EvalMultiAll, and checks that
-- both agree.
CREATE OR REPLACE FUNCTION drip.block_apply(p_op int, p_keys bytea[], p_kinds int[],
    p_rates bigint[], p_periods bigint[], p_bursts bigint[], p_maxres bigint[], p_starts bigint[],
    p_costs bigint[], p_reserves bool[], p_leases text[], p_blocks text[], p_ttls bigint[],
    p_at bigint, p_dl bigint)
RETURNS TABLE (ord int, allowed bool, present bool, tokens bigint, ts bigint, ids text[],
    sizes bigint[], exps bigint[], n_tokens bigint, n_ts bigint, n_blocks int,
    live bigint, held bool, earliest bigint, latest bigint, now bigint, late bool)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n int := coalesce(cardinality(p_keys), 0);
    v_clock bigint;
    v_class int[];
    v_write bool[];
    v_present bool[];
    v_exists bool[];
    v_next drip.buckets[];
    v_row drip.buckets;
    v_all bool := true;
    k record;
    r record;
    e record;
    s record;
    j int;
    v_exp bigint;
BEGIN
    -- The class of each item: 0 a bucket (with its blocks), 1 a
    -- concurrency limit.
    FOR i IN 1 .. n LOOP
        v_class[i] := CASE WHEN p_kinds[i] = 3 THEN 1 ELSE 0 END;
    END LOOP;
    FOR k IN SELECT u.c, u.key FROM unnest(v_class, p_keys) AS u(c, key) ORDER BY u.c, u.key LOOP
        IF k.c = 0 THEN
            PERFORM FROM drip.buckets b WHERE b.key = k.key FOR UPDATE;
        ELSE
            PERFORM FROM drip.leases l WHERE l.key = k.key FOR UPDATE;
        END IF;
    END LOOP;
    v_clock := drip.clock();
    now := coalesce(p_at, v_clock);
    late := p_dl IS NOT NULL AND v_clock >= p_dl;
    IF late THEN
        FOR i IN 1 .. n LOOP
            ord := i; allowed := false; present := false; tokens := 0; ts := 0;
            ids := '{}'; sizes := '{}'; exps := '{}'; n_tokens := 0; n_ts := 0; n_blocks := 0;
            live := 0; held := false; earliest := 0; latest := 0;
            RETURN NEXT;
        END LOOP;
        RETURN;
    END IF;
    -- Decide each item on its state as read (under the locks: each query
    -- of a VOLATILE function reads a fresh snapshot, which holds every
    -- write committed before the lock was got).
    FOR i IN 1 .. n LOOP
        ord := i;
        present := false; tokens := 0; ts := 0; ids := '{}'; sizes := '{}'; exps := '{}';
        live := 0; held := false; earliest := 0; latest := 0;
        n_blocks := 0;
        v_row := NULL;
        IF v_class[i] = 1 THEN
            s := drip.lease_read(p_keys[i], p_leases[i], now);
            present := s.present; live := s.live; held := s.held; earliest := s.earliest; latest := s.latest;
            allowed := p_op = 2 OR s.held OR s.live < p_bursts[i] / 1000000;
            v_write[i] := allowed AND p_op <> 1 AND (p_op = 0 OR s.present);
            n_tokens := 0; n_ts := 0;
        ELSE
            -- A row holding a sliding window's counts (migration 6) is no
            -- state for a bucket (as eval.sql reads it): the bucket starts
            -- fresh, and its write replaces the row (v_exists).
            SELECT b.tokens, b.ts, b.counts, b.ids, b.sizes, b.exps INTO r
            FROM drip.buckets b WHERE b.key = p_keys[i] FOR UPDATE;
            v_exists[i] := FOUND;
            present := FOUND AND r.counts IS NULL;
            IF present THEN
                tokens := r.tokens; ts := r.ts;
                ids := coalesce(r.ids, '{}'); sizes := coalesce(r.sizes, '{}'); exps := coalesce(r.exps, '{}');
            END IF;
            -- bucket.EvalBlocks
            e := drip.block_step(p_op, present, tokens, ts, ids, sizes, exps, p_kinds[i], p_rates[i],
                                 p_periods[i], p_bursts[i], p_maxres[i], p_starts[i], p_costs[i],
                                 p_reserves[i], p_blocks[i], p_ttls[i], now);
            allowed := e.allowed;
            v_write[i] := e.write;
            n_tokens := e.n_tokens; n_ts := e.n_ts;
            v_row.tokens := e.n_tokens; v_row.ts := e.n_ts;
            v_row.ids := e.n_ids; v_row.sizes := e.n_sizes; v_row.exps := e.n_exps;
            n_blocks := coalesce(cardinality(v_row.ids), 0);
        END IF;
        v_next[i] := v_row;
        v_present[i] := present;
        v_all := v_all AND allowed;
        RETURN NEXT;
    END LOOP;
    IF p_op = 1 OR (p_op = 0 AND NOT v_all) THEN
        RETURN;
    END IF;
    -- The writes, in the order of the locks. A key left without blocks
    -- has NULL ones, so the plain statements decide it again.
    FOR k IN SELECT u.c, u.i FROM unnest(v_class, p_keys) WITH ORDINALITY AS u(c, key, i)
             ORDER BY u.c, u.key LOOP
        j := k.i;
        CONTINUE WHEN NOT v_write[j];
        v_row := v_next[j];
        IF k.c = 1 THEN
            PERFORM drip.ensure(drip.lease_write(p_op, p_keys[j], p_leases[j], p_periods[j], now, v_present[j]));
            CONTINUE;
        END IF;
        v_exp := drip.block_expires(p_kinds[j], p_rates[j], p_periods[j], p_bursts[j],
            v_row.tokens, v_row.ts, v_row.exps);
        IF coalesce(cardinality(v_row.ids), 0) = 0 THEN
            v_row.ids := NULL; v_row.sizes := NULL; v_row.exps := NULL;
        END IF;
        IF v_exists[j] THEN
            UPDATE drip.buckets b SET tokens = v_row.tokens, ts = v_row.ts, expires = v_exp, counts = NULL,
                ids = v_row.ids, sizes = v_row.sizes, exps = v_row.exps
            WHERE b.key = p_keys[j];
        ELSE
            INSERT INTO drip.buckets (key, tokens, ts, expires, ids, sizes, exps)
            VALUES (p_keys[j], v_row.tokens, v_row.ts, v_exp, v_row.ids, v_row.sizes, v_row.exps)
            ON CONFLICT (key) DO NOTHING;
            PERFORM drip.ensure(FOUND);
        END IF;
    END LOOP;
END $$;

-- drip.block_batch decides many independent single-item calls (from
-- concurrent callers: block takes and returns of leased instances, and
-- undo refunds of them) in one statement, as the batches of batch.sql
-- decide plain takes: each as if alone, in array order per key, each
-- seeing the bucket and blocks the one before left, and each key's row
-- written once, at the end. One array per field, one element per call,
-- as drip.block_apply's (ops per element), with $13 times in ns (NULL
-- elements: the server's clock, read once after the locks) and $14
-- deadlines in the server's clock (NULL elements: none). No element is a
-- sliding window or a concurrency limit.
--
-- It locks the rows of the keys in key order (as batch.sql does), then
-- decides each element with drip.block_step on its key's state. An
-- element whose deadline passed when the locks were got is late: it is
-- left out (neither decided nor written). A key whose row appeared after
-- it was read raises 40001 (drip.ensure), and the store runs the batch
-- again. A row per element, in order, with drip.block_apply's columns:
-- the state its element was decided on and the state it left, so that
-- the Go store decides each element again with bucket.EvalBlocks and
-- checks that both agree.
CREATE OR REPLACE FUNCTION drip.block_batch(p_ops int[], p_keys bytea[], p_kinds int[],
    p_rates bigint[], p_periods bigint[], p_bursts bigint[], p_maxres bigint[], p_starts bigint[],
    p_costs bigint[], p_reserves bool[], p_blocks text[], p_ttls bigint[], p_ats bigint[], p_dls bigint[])
RETURNS TABLE (ord int, allowed bool, present bool, tokens bigint, ts bigint, ids text[],
    sizes bigint[], exps bigint[], n_tokens bigint, n_ts bigint, n_blocks int,
    live bigint, held bool, earliest bigint, latest bigint, now bigint, late bool)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n int := coalesce(cardinality(p_keys), 0);
    v_clock bigint;
    v_keys bytea[] := '{}'; -- the keys, in the order first met
    v_exists bool[];        -- a row of the key was read
    v_present bool[];       -- a bucket of the key (no sliding window's counts)
    v_dirty bool[];
    v_rows drip.buckets[];  -- each key's state, as its last write left it
    v_row drip.buckets;
    e record;
    k record;
    j int;
BEGIN
    PERFORM FROM drip.buckets b WHERE b.key = ANY (p_keys) ORDER BY b.key FOR UPDATE;
    v_clock := drip.clock();
    live := 0; held := false; earliest := 0; latest := 0;
    FOR i IN 1 .. n LOOP
        ord := i;
        now := coalesce(p_ats[i], v_clock);
        late := p_dls[i] IS NOT NULL AND v_clock >= p_dls[i];
        present := false; tokens := 0; ts := 0; ids := '{}'; sizes := '{}'; exps := '{}';
        allowed := false; n_tokens := 0; n_ts := 0; n_blocks := 0;
        IF late THEN
            RETURN NEXT;
            CONTINUE;
        END IF;
        j := array_position(v_keys, p_keys[i]);
        IF j IS NULL THEN
            -- read under the lock: a fresh snapshot, which holds every
            -- write committed before the lock was got
            v_keys := v_keys || p_keys[i];
            j := cardinality(v_keys);
            SELECT b.* INTO v_row FROM drip.buckets b WHERE b.key = p_keys[i];
            v_exists[j] := FOUND;
            v_present[j] := FOUND AND v_row.counts IS NULL;
            v_dirty[j] := false;
            v_rows[j] := v_row;
        END IF;
        v_row := v_rows[j];
        present := v_present[j];
        IF present THEN
            tokens := v_row.tokens; ts := v_row.ts;
            ids := coalesce(v_row.ids, '{}'); sizes := coalesce(v_row.sizes, '{}'); exps := coalesce(v_row.exps, '{}');
        END IF;
        e := drip.block_step(p_ops[i], present, tokens, ts, ids, sizes, exps, p_kinds[i], p_rates[i],
                             p_periods[i], p_bursts[i], p_maxres[i], p_starts[i], p_costs[i],
                             p_reserves[i], p_blocks[i], p_ttls[i], now);
        allowed := e.allowed;
        n_tokens := e.n_tokens; n_ts := e.n_ts;
        n_blocks := coalesce(cardinality(e.n_ids), 0);
        IF e.write AND p_ops[i] <> 1 THEN
            v_row.key := p_keys[i];
            v_row.tokens := e.n_tokens; v_row.ts := e.n_ts; v_row.counts := NULL;
            v_row.ids := e.n_ids; v_row.sizes := e.n_sizes; v_row.exps := e.n_exps;
            v_row.expires := drip.block_expires(p_kinds[i], p_rates[i], p_periods[i], p_bursts[i],
                                                e.n_tokens, e.n_ts, e.n_exps);
            v_rows[j] := v_row;
            v_present[j] := true;
            v_dirty[j] := true;
        END IF;
        RETURN NEXT;
    END LOOP;
    -- The writes, in key order. A key left without blocks has NULL ones,
    -- so the plain statements decide it again.
    FOR k IN SELECT u.j FROM unnest(v_keys) WITH ORDINALITY AS u(key, j) ORDER BY u.key LOOP
        j := k.j;
        CONTINUE WHEN NOT v_dirty[j];
        v_row := v_rows[j];
        IF coalesce(cardinality(v_row.ids), 0) = 0 THEN
            v_row.ids := NULL; v_row.sizes := NULL; v_row.exps := NULL;
        END IF;
        IF v_exists[j] THEN
            UPDATE drip.buckets b SET tokens = v_row.tokens, ts = v_row.ts, expires = v_row.expires, counts = NULL,
                ids = v_row.ids, sizes = v_row.sizes, exps = v_row.exps
            WHERE b.key = v_row.key;
        ELSE
            INSERT INTO drip.buckets (key, tokens, ts, expires, ids, sizes, exps)
            VALUES (v_row.key, v_row.tokens, v_row.ts, v_row.expires, v_row.ids, v_row.sizes, v_row.exps)
            ON CONFLICT (key) DO NOTHING;
            PERFORM drip.ensure(FOUND);
        END IF;
    END LOOP;
END $$;
