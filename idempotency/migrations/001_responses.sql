CREATE TABLE {{schema}}.{{table}} (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    status      integer     NOT NULL,
    headers     text[]      NOT NULL,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

CREATE INDEX {{created_at_idx}} ON {{schema}}.{{table}} (created_at);
