-- Migration 4: a record of the latest override changes, so that an
-- instance applies what changed since its snapshot rather than reloading
-- every override (package override's OverridesSince).
--
-- drip.override_changes holds the version of each key's latest change
-- (a set or a delete), trimmed to the latest changes; floor is the
-- version after which it holds every change, and logged the version of
-- the latest change it recorded (a version beyond it was changed by a
-- drip that records none: what changed is then unknown, and instances
-- load every override until the next recorded change). held is how
-- many overrides drip.overrides holds, kept by every change (under the
-- version row's lock), so that the bound on their number costs no count.
CREATE TABLE drip.override_changes (
    key     bytea PRIMARY KEY,
    version bigint NOT NULL
);
CREATE INDEX override_changes_version ON drip.override_changes (version);
ALTER TABLE drip.overrides_version
    ADD COLUMN floor  bigint NOT NULL DEFAULT 0,
    ADD COLUMN logged bigint NOT NULL DEFAULT -1,
    ADD COLUMN held   bigint NOT NULL DEFAULT 0;
UPDATE drip.overrides_version SET floor = version, logged = version, held = (SELECT count(*) FROM drip.overrides);
