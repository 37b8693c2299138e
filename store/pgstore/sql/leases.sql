-- leases.sql: the leases of concurrency limits (kind 3), one row each in
-- drip.lease_holders under the key's row in drip.leases (migration 5).
-- Installed (CREATE OR REPLACE) by every install, like functions.sql.
--
-- A statement locks the key's row in drip.leases (FOR UPDATE) and then
-- calls these functions: they are VOLATILE, so each of their queries reads
-- a fresh snapshot (at READ COMMITTED), which holds every lease that the
-- statements before the lock committed. Each step costs a few index
-- lookups, whatever the number of leases the key holds, plus one per
-- lease that expired since the key was last written (a write drops them).
--
-- enable_seqscan is off in the functions that read the leases and keys: plpgsql
-- keeps a generic plan of each query after a few calls, and the generic
-- plan of "key = $1 AND exp <= $2" guesses a third of the table and scans
-- it whole (measured: a hot key at 1,000 leases fell to 1,300 pairs/s);
-- every query here is meant for the (key, id) and (key, exp) indexes.

-- drip.lease_read is bucket.Leases: for lease p_lease at p_now, whether the
-- key has a row in drip.leases, how many of its leases are live, whether
-- p_lease is among them, and the earliest and latest live expiry (0: none
-- live). It writes nothing. It locks the key's row (a no-op when the
-- statement did already): a row a concurrent first acquire made and
-- committed after the statement's own locking read is seen here, and must
-- be held before its leases are counted and written. A key with a row in
-- drip.buckets (a bucket's or a sliding window's, written after the
-- leases: an acquire deletes that row, see drip.lease_write) holds a
-- state of another shape, and its leases count as none
-- (docs/semantics.md, "When a limit changes").
CREATE OR REPLACE FUNCTION drip.lease_read(p_key bytea, p_lease text, p_now bigint,
    OUT present bool, OUT live bigint, OUT held bool, OUT earliest bigint, OUT latest bigint)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    v_n bigint;
BEGIN
    live := 0; held := false; earliest := 0; latest := 0;
    SELECT l.n INTO v_n FROM drip.leases l WHERE l.key = p_key FOR UPDATE;
    present := FOUND;
    IF NOT present OR v_n = 0 OR EXISTS (SELECT FROM drip.buckets b WHERE b.key = p_key) THEN
        RETURN;
    END IF;
    SELECT h.exp INTO latest FROM drip.lease_holders h WHERE h.key = p_key ORDER BY h.exp DESC LIMIT 1;
    IF latest IS NULL OR latest <= p_now THEN
        latest := 0;
        RETURN;
    END IF;
    live := v_n - (SELECT count(*) FROM drip.lease_holders h WHERE h.key = p_key AND h.exp <= p_now);
    SELECT h.exp INTO earliest FROM drip.lease_holders h WHERE h.key = p_key AND h.exp > p_now ORDER BY h.exp LIMIT 1;
    held := p_lease <> '' AND EXISTS (
        SELECT FROM drip.lease_holders h WHERE h.key = p_key AND h.id = p_lease AND h.exp > p_now);
END $$;

-- drip.lease_write is bucket.Params.NextLeases, for a decision that
-- bucket.Params.EvalLeases says to write (op 0, an acquire or renewal; op
-- 2, a release) of lease p_lease with TTL p_period at p_now, on a key whose
-- row the statement locked (p_present) or found missing: the leases
-- expired by p_now are dropped, then the lease is acquired or renewed
-- (now + TTL, rounded up to a whole microsecond) or released; n and
-- expires follow. A release of a key without a row writes nothing. A
-- first acquire makes the key's row, and clears what a reset or sweep
-- left of its leases (rows it could not see); it returns false if a
-- concurrent statement made the row first: the caller's snapshot missed
-- that statement's leases, and the caller must raise 40001 (drip.ensure)
-- so that it is run again. An acquire deletes the key's row in
-- drip.buckets, a state of another shape; if it had one, the leases
-- before were from before it (drip.lease_read counted none) and go too.
CREATE OR REPLACE FUNCTION drip.lease_write(p_op int, p_key bytea, p_lease text, p_period bigint,
    p_now bigint, p_present bool)
RETURNS bool
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    v_dropped bigint;
    v_added bigint := 0;
    v_exp bigint;
    v_latest bigint;
BEGIN
    IF p_op = 0 THEN
        DELETE FROM drip.buckets b WHERE b.key = p_key;
        IF FOUND AND p_present THEN
            DELETE FROM drip.lease_holders h WHERE h.key = p_key;
            UPDATE drip.leases l SET n = 0 WHERE l.key = p_key;
        END IF;
    END IF;
    IF NOT p_present THEN
        IF p_op <> 0 THEN
            RETURN true;
        END IF;
        INSERT INTO drip.leases AS l (key, n, expires) VALUES (p_key, 0, p_now) ON CONFLICT (key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        DELETE FROM drip.lease_holders h WHERE h.key = p_key;
    ELSE
        DELETE FROM drip.lease_holders h WHERE h.key = p_key AND h.exp <= p_now;
    END IF;
    GET DIAGNOSTICS v_dropped = ROW_COUNT;
    IF NOT p_present THEN
        v_dropped := 0;
    END IF;
    IF p_op = 0 THEN
        v_exp := CASE WHEN p_now + p_period > 0 THEN (p_now + p_period + 999) / 1000
                      ELSE (p_now + p_period) / 1000 END * 1000;
        UPDATE drip.lease_holders h SET exp = v_exp WHERE h.key = p_key AND h.id = p_lease;
        IF NOT FOUND THEN
            INSERT INTO drip.lease_holders (key, id, exp) VALUES (p_key, p_lease, v_exp);
            v_added := 1;
        END IF;
    ELSE
        DELETE FROM drip.lease_holders h WHERE h.key = p_key AND h.id = p_lease;
        GET DIAGNOSTICS v_added = ROW_COUNT;
        v_added := -v_added;
    END IF;
    SELECT h.exp INTO v_latest FROM drip.lease_holders h WHERE h.key = p_key ORDER BY h.exp DESC LIMIT 1;
    UPDATE drip.leases l SET n = l.n - v_dropped + v_added, expires = coalesce(v_latest, p_now)
    WHERE l.key = p_key;
    RETURN true;
END $$;

-- drip.lease_drop deletes a key's leases and its row (Reset, and the
-- sweeper, which locked the row already): the row first, which waits for
-- a statement that holds it, then the leases, read with a fresh snapshot
-- that holds every lease committed before. True if the key had a row.
CREATE OR REPLACE FUNCTION drip.lease_drop(p_key bytea) RETURNS bool
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    v_had bool;
BEGIN
    DELETE FROM drip.leases l WHERE l.key = p_key;
    v_had := FOUND;
    DELETE FROM drip.lease_holders h WHERE h.key = p_key;
    RETURN v_had;
END $$;

-- drip.lease_batch decides many requests on concurrency limits (from
-- concurrent callers) in one statement, each as if alone, in array order:
-- a request sees what the ones before it on the same key wrote. One array
-- per field: ops (0 acquire, 1 peek, 2 release), keys, slots, TTLs in ns,
-- lease IDs, times in ns (NULL: the server's clock, read once, after the
-- locks) and the callers' deadlines in the server's clock (NULL: none). It
-- locks the keys' rows in key order (so batches never deadlock each
-- other), then decides and writes each request; a request whose deadline
-- passed when the locks were got is late: neither decided nor written.
-- Each result row is a request's index, the verdict of
-- bucket.Params.EvalLeases (the Go store checks it against its own), what
-- bucket.Leases read before it, its time, and whether it was late.
CREATE OR REPLACE FUNCTION drip.lease_batch(p_ops int[], p_keys bytea[], p_slots bigint[],
    p_periods bigint[], p_leases text[], p_ats bigint[], p_dls bigint[])
RETURNS TABLE (ord int, allowed bool, live bigint, held bool, earliest bigint, latest bigint,
    now bigint, late bool)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    v_clock bigint;
    s record;
BEGIN
    PERFORM FROM drip.leases l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
    v_clock := drip.clock();
    FOR j IN 1 .. coalesce(cardinality(p_keys), 0) LOOP
        ord := j;
        IF p_dls[j] IS NOT NULL AND v_clock >= p_dls[j] THEN
            allowed := false; live := 0; held := false; earliest := 0; latest := 0;
            now := v_clock; late := true;
            RETURN NEXT;
            CONTINUE;
        END IF;
        now := coalesce(p_ats[j], v_clock);
        late := false;
        s := drip.lease_read(p_keys[j], p_leases[j], now);
        live := s.live; held := s.held; earliest := s.earliest; latest := s.latest;
        allowed := p_ops[j] = 2 OR s.held OR s.live < p_slots[j];
        IF allowed AND p_ops[j] <> 1 THEN
            PERFORM drip.ensure(drip.lease_write(p_ops[j], p_keys[j], p_leases[j], p_periods[j], now, s.present));
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;
