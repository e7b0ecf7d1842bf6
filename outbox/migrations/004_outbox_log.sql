-- The log table: what a LogMode Emit writes, one row per call holding all
-- its messages in one body (logbody.go), with no index, so that an emit
-- costs one heap row. The LogRelay reads the rows from the replication
-- stream; they are kept, as the record a relay recovers from when its
-- slot is lost, until the slot has confirmed them. Two halves take the
-- rows in turn: emits write to the one log_half names, and the log
-- relay's cleanup switches halves and truncates the other once the slot
-- has confirmed everything in it, instead of deleting rows.
CREATE TABLE {{schema}}.{{log_half}} (
    half smallint NOT NULL CHECK (half IN (0, 1))
);
INSERT INTO {{schema}}.{{log_half}} (half) VALUES (0);

CREATE TABLE {{schema}}.{{log}} (
    half       smallint    NOT NULL,
    id         bigserial   NOT NULL,
    n          integer     NOT NULL,
    body       bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (half);
CREATE TABLE {{schema}}.{{log_first}} PARTITION OF {{schema}}.{{log}} FOR VALUES IN (0);
CREATE TABLE {{schema}}.{{log_second}} PARTITION OF {{schema}}.{{log}} FOR VALUES IN (1);
-- Bodies are stored uncompressed: they are written once and read once,
-- and compressing them costs the emitting transaction more than the bytes
-- it saves.
ALTER TABLE {{schema}}.{{log_first}} ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE {{schema}}.{{log_second}} ALTER COLUMN body SET STORAGE EXTERNAL;
