CREATE TABLE IF NOT EXISTS {{schema}}.{{table}} (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL,
    -- next offset to consume; NULL until a batch of the partition committed
    next_offset bigint,
    -- consumer group generation that last claimed or wrote the row
    generation  integer     NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);
