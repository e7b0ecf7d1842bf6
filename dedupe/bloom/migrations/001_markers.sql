CREATE SCHEMA IF NOT EXISTS {{schema}};

-- Markers, partitioned by slice: the start of the time slice a marker was
-- written in. Every partition holds exactly one slice, so the primary key
-- makes (scope, id) unique within a partition; partitions are created and
-- dropped by the strategy's maintenance, not by migrations.
CREATE TABLE {{schema}}.{{table}} (
    scope       text        NOT NULL,
    id          text        NOT NULL,
    slice       timestamptz NOT NULL,
    fingerprint bytea,
    PRIMARY KEY (scope, id, slice)
) PARTITION BY RANGE (slice);
