-- Migration 9: the notice board (store.Board), where each instance keeps
-- one small blob for the others (the fleet's top keys, package topkeys).
--
-- One row per instance: its blob, when it was put and when it expires,
-- by the server's clock. Every put deletes the expired rows first, so
-- the table holds at most the live instances (store.MaxBoardInstances).
-- Logged whatever the buckets' persistence, as the overrides are: it is
-- written a few times a minute per instance. Independent of every other
-- table: no migration before it is read.
CREATE TABLE drip.board (
    instance text        PRIMARY KEY,
    blob     bytea       NOT NULL,
    put      timestamptz NOT NULL,
    expires  timestamptz NOT NULL
);
