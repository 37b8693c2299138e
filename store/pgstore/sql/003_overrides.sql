-- Migration 3: per-tenant overrides (package override).
--
-- One row per bucket key whose limit is overridden: value is the override
-- as JSON (rule, values, limit), which drip decodes; the database only
-- keeps it. drip.overrides_version holds one number that every change
-- bumps, in the transaction of the change, so that instances poll one
-- row to learn whether to reload; a change also sends NOTIFY
-- drip_overrides at its commit.
CREATE TABLE drip.overrides (
    key   bytea PRIMARY KEY,
    value bytea NOT NULL
);
CREATE TABLE drip.overrides_version (
    one     bool   PRIMARY KEY DEFAULT true CHECK (one),
    version bigint NOT NULL
);
INSERT INTO drip.overrides_version VALUES (true, 0);
