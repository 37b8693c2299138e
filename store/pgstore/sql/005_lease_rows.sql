-- Migration 5: a row per lease, so that an acquire or release costs the
-- same whatever the number of leases a key holds (migration 2 kept them
-- all in one row of arrays, rewritten whole on each write).
--
-- drip.leases keeps one row per key of a concurrency limit: the row that
-- every decision on the key locks (FOR UPDATE), n the number of its rows in
-- drip.lease_holders (expired ones not yet dropped among them), and
-- expires the latest expiry among them, for the sweeper. drip.lease_holders
-- holds the leases, one row each: the lease ID and its expiry (ns, whole
-- microseconds, bucket.Params.LeaseExp). Only a statement that holds the
-- key's row in drip.leases writes the key's leases (sql/leases.sql), so two
-- acquires of the last slot still queue on that one row lock.
CREATE {{PERSISTENCE}} TABLE drip.lease_holders (
    key bytea  NOT NULL,
    id  text   NOT NULL,
    exp bigint NOT NULL,
    PRIMARY KEY (key, id)
);
CREATE INDEX lease_holders_exp ON drip.lease_holders (key, exp);
INSERT INTO drip.lease_holders (key, id, exp)
SELECT l.key, x.id, x.e FROM drip.leases l, unnest(l.ids, l.exps) AS x(id, e);
ALTER TABLE drip.leases ADD COLUMN n bigint NOT NULL DEFAULT 0;
UPDATE drip.leases SET n = cardinality(ids);
ALTER TABLE drip.leases DROP COLUMN ids, DROP COLUMN exps;
-- An UNLOGGED install keeps its leases unlogged too.
DO $$
BEGIN
    IF (SELECT relpersistence FROM pg_class WHERE oid = 'drip.leases'::regclass) = 'u' THEN
        ALTER TABLE drip.lease_holders SET UNLOGGED;
    END IF;
END $$;
