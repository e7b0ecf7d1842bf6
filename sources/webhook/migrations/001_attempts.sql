CREATE TABLE IF NOT EXISTS {{schema}}.{{table}} (
    -- Config.Name of the source
    source     text        NOT NULL,
    event_id   text        NOT NULL,
    -- deliveries of the event that reached a handler and were not
    -- acknowledged: the next delivery is attempt attempts + 1
    attempts   integer     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);
CREATE INDEX IF NOT EXISTS {{index}} ON {{schema}}.{{table}} (source, updated_at);
