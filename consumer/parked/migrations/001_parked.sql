CREATE TABLE IF NOT EXISTS {{schema}}.{{table}} (
    id           bigserial   PRIMARY KEY,
    consumer     text        NOT NULL,
    scope        text        NOT NULL,
    -- The dedupe key, when the message had a valid one.
    dedupe_id    text,
    sender       text,
    seq          bigint,
    fingerprint  bytea,
    -- True when a dedupe marker was written with this row: redelivery of the
    -- same message is then a duplicate, and a redrive applies it without
    -- claiming the key again.
    has_marker   boolean     NOT NULL,
    -- Where the message came from.
    source       text        NOT NULL,
    lane         text        NOT NULL,
    ref          text        NOT NULL,
    -- The whole message.
    msg_key      bytea,
    payload      bytea,
    headers      jsonb       NOT NULL DEFAULT '[]',
    message_time timestamptz,
    -- Why it was parked.
    attempts     integer     NOT NULL,
    reason       text        NOT NULL,
    last_error   text        NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now()
);

-- A message parked once is not parked again when it is redelivered.
CREATE UNIQUE INDEX IF NOT EXISTS {{ref_idx}} ON {{schema}}.{{table}} (scope, source, ref) WHERE ref <> '';
CREATE INDEX IF NOT EXISTS {{parked_at_idx}} ON {{schema}}.{{table}} (scope, parked_at);
