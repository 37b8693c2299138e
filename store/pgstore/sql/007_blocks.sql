-- Migration 7: the state of leased limits (package leased), apart from
-- drip.buckets as Redis keeps it under the key followed by "#leased".
--
-- One row per key of a leased limit that has state: key as in
-- drip.buckets, its bucket (tokens, ts: micro-tokens and nanoseconds, as
-- there), and its blocks of leased tokens, one element each in ids, sizes
-- (micro-tokens) and exps (ns): the blocks taken and neither returned nor
-- dropped yet (a decision that writes drops the expired ones; see
-- bucket.EvalBlocks). expires is when the row carries no more
-- information (every block expired and the bucket, refilled under their
-- caps, full again; no earlier than bucket.Params.StateExpiresAt): the
-- sweeper deletes it after.
-- A key holds at most bucket.MaxBlocks (64) live blocks, so the arrays
-- stay small; only sql/blocks.sql writes them, holding the row's lock.
-- Independent of every other table: no migration before it is read.
CREATE {{PERSISTENCE}} TABLE drip.blocks (
    key     bytea    PRIMARY KEY,
    tokens  bigint   NOT NULL,
    ts      bigint   NOT NULL,
    ids     text[]   NOT NULL,
    sizes   bigint[] NOT NULL,
    exps    bigint[] NOT NULL,
    expires bigint   NOT NULL
) WITH (fillfactor = 80);
-- An UNLOGGED install keeps its blocks unlogged too.
DO $$
BEGIN
    IF (SELECT relpersistence FROM pg_class WHERE oid = 'drip.buckets'::regclass) = 'u' THEN
        ALTER TABLE drip.blocks SET UNLOGGED;
    END IF;
END $$;
