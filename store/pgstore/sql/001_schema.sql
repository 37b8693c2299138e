-- Migration 1: the bucket table.
--
-- One row per key that has state. key is the bucket key as bytes (keys
-- longer than 512 bytes, and keys whose first byte is 0xff, are stored as
-- 0xff || sha256(key), so every index entry is small); tokens is micro-tokens
-- (negative while a reservation is in debt); ts is nanoseconds since the
-- Unix epoch; expires is the instant (ns) from which the bucket carries no
-- information (drip.Params.ExpiresAt: full again): decisions then treat it
-- as fresh, and the sweeper deletes it.
--
-- {{PERSISTENCE}} is empty (a logged table, the default) or UNLOGGED
-- (faster: no WAL; the table is emptied by crash recovery, which can admit
-- up to one extra burst per key right after a crash).
CREATE {{PERSISTENCE}} TABLE drip.buckets (
    key     bytea  PRIMARY KEY,
    tokens  bigint NOT NULL,
    ts      bigint NOT NULL,
    expires bigint NOT NULL
) WITH (fillfactor = 80);
