CREATE SCHEMA IF NOT EXISTS {{schema}};

-- One row per (scope, sender): the highest sequence number applied, and the
-- payload fingerprint of that message (NULL when unknown or advanced past).
CREATE TABLE IF NOT EXISTS {{schema}}.{{marks}} (
    scope       text        NOT NULL,
    sender      text        NOT NULL,
    seq         bigint      NOT NULL CHECK (seq >= 0),
    fingerprint bytea,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, sender)
);
