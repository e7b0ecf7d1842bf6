CREATE TABLE {{schema}}.{{table}} (
    scope        text        NOT NULL,
    id           text        NOT NULL,
    fingerprint  bytea,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, id)
);

CREATE INDEX {{processed_at_idx}} ON {{schema}}.{{table}} (processed_at);
