-- Migration 2: the lease table of concurrency limits.
--
-- One row per key of a concurrency limit: ids are its leases and exps
-- their expiries (ns, whole microseconds, bucket.Params.LeaseExp), in step;
-- expired leases are dropped at the next write. expires is the latest
-- expiry (the key carries no information after it); the sweeper deletes
-- the row SweepMargin later. Keys are stored as in drip.buckets. All the
-- leases of a key are in its one row, so that a statement that locks the
-- row (FOR UPDATE, which reads the row's latest version after waiting)
-- counts every lease a concurrent statement committed before it: two
-- acquires of the last slot cannot both pass.
CREATE {{PERSISTENCE}} TABLE drip.leases (
    key     bytea    PRIMARY KEY,
    ids     text[]   NOT NULL,
    exps    bigint[] NOT NULL,
    expires bigint   NOT NULL
);
